"""``omniduplex agent``: a livekit-agents worker whose realtime model is the pipeline.

LiveKit dispatches a job per room to one of the registered workers (scale-out: run more workers);
each job runs :func:`entrypoint`, an ``AgentSession`` whose ``llm`` is our realtime model, joined to the
room. The worker's CLI is livekit-agents' own (``start``, ``dev``, ``console``, ``connect``), reading
``LIVEKIT_URL`` / ``LIVEKIT_API_KEY`` / ``LIVEKIT_API_SECRET`` (and ``LIVEKIT_AGENT_NAME``: explicit
dispatch by that name, e.g. from a SIP dispatch rule; unset = every new room gets the agent).

Settings, from the environment (set by ``omniduplex agent`` options; job processes inherit them):

* ``OMNIDUPLEX_REALTIME_URL``: an omniduplex server's ``/v1/realtime`` (remote mode,
  :class:`~.remote.RemoteRealtimeModel`), with ``OMNIDUPLEX_API_KEY``; unset = the pipeline in each job
  process (:class:`~.local_model.PipelineRealtimeModel`, ``OMNIDUPLEX_MODEL``: checkpoint / manifest /
  ``tiny``; one pipeline per job process: fine for ``console`` and one room, heavy for many).
* ``OMNIDUPLEX_INSTRUCTIONS``: the agent's instructions (default: the cascade's system prompt).
* ``OMNIDUPLEX_GREETING``: instructions for a first reply when the session starts (unset: wait for the user).
* ``OMNIDUPLEX_MCP``: ``--mcp`` declarations, one per line: MCP tool servers of every job's session
  (:mod:`.mcp_servers`; livekit-agents offers their tools to the model and runs its calls).

The agent's state (``lk.agent.state`` participant attribute: listening / thinking / speaking) is set by
livekit-agents' room I/O from the session's state, which it derives from the model's events: speaking from
the first reply frame played, listening when the reply ends or is interrupted. For realtime models
livekit-agents 1.8.9 sets "thinking" only around tool calls, so :func:`show_thinking` adds it for the time
between a reply being scheduled and its first audio.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from livekit import api
from livekit.agents import NOT_GIVEN, Agent, AgentServer, AgentSession, JobContext, cli, llm

from omniduplex.app.surfaces.livekit.mcp_servers import servers_from_env

log = logging.getLogger("omniduplex.livekit")

ENV_CREDENTIALS = ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET")
CONNECTING_COMMANDS = ("start", "dev", "connect")
"""Worker commands that register with a LiveKit server (``console`` runs locally, without one)."""


def build_model() -> llm.RealtimeModel:
    """The realtime model the environment asks for (see the module docstring)."""
    url = os.environ.get("OMNIDUPLEX_REALTIME_URL")
    if url:
        from omniduplex.app.surfaces.livekit.remote import RemoteOptions, RemoteRealtimeModel

        return RemoteRealtimeModel(
            RemoteOptions(url=url, api_key=os.environ.get("OMNIDUPLEX_API_KEY") or None)
        )
    from omniduplex.app.surfaces.livekit.local_model import PipelineOptions, PipelineRealtimeModel

    processes = os.environ.get("OMNIDUPLEX_PROCESSES", "0") == "1"
    return PipelineRealtimeModel(
        options=PipelineOptions(model=os.environ.get("OMNIDUPLEX_MODEL"), processes=processes)
    )


def instructions() -> str:
    from omniduplex.app.host.pipeline import CASCADE_SYSTEM_PROMPT

    return os.environ.get("OMNIDUPLEX_INSTRUCTIONS") or CASCADE_SYSTEM_PROMPT


def show_thinking(session: AgentSession) -> None:
    """Report the agent as "thinking" from the moment a reply is scheduled until its first audio plays
    (livekit-agents then sets "speaking"); a reply that never plays goes back to "listening"."""

    def on_speech(ev) -> None:
        if session.agent_state == "listening":
            session._update_agent_state("thinking")  # no public setter in livekit-agents 1.8.9

        def done(_) -> None:
            if session.agent_state == "thinking":
                session._update_agent_state("listening")

        ev.speech_handle.add_done_callback(done)

    session.on("speech_created", on_speech)


def make_session(model: llm.RealtimeModel, **kwargs) -> AgentSession:
    """A job's ``AgentSession`` on ``model``, with the MCP servers of ``OMNIDUPLEX_MCP`` (``agent --mcp``)
    as its tool servers; ``kwargs`` go to ``AgentSession``.

    Raises:
        ValueError: a malformed declaration in ``OMNIDUPLEX_MCP``.
    """
    return AgentSession(llm=model, mcp_servers=servers_from_env() or NOT_GIVEN, **kwargs)


async def entrypoint(ctx: JobContext) -> None:
    """One room: the model, an AgentSession on it, joined to the room until the participant leaves."""
    model = build_model()
    start = getattr(model, "start", None)
    if start is not None:
        await start()
    ctx.add_shutdown_callback(model.aclose)
    session = make_session(model)
    show_thinking(session)
    await session.start(agent=Agent(instructions=instructions()), room=ctx.room)
    greeting = os.environ.get("OMNIDUPLEX_GREETING")
    if greeting:
        session.generate_reply(instructions=greeting)


def make_server() -> AgentServer:
    """The worker: :func:`entrypoint` per room (agent name from ``LIVEKIT_AGENT_NAME`` if set)."""
    server = AgentServer()
    server.rtc_session(entrypoint)
    return server


async def check_credentials(url: str, key: str, secret: str, timeout_s: float = 5.0) -> str | None:
    """Ask the LiveKit server to list rooms with these credentials: ``None`` if accepted (or if the server
    cannot be reached: the worker itself retries connecting), else one line saying why it refused."""
    import aiohttp

    try:
        async with api.LiveKitAPI(url, key, secret, timeout=aiohttp.ClientTimeout(total=timeout_s)) as lk:
            await lk.room.list_rooms(api.ListRoomsRequest())
    except api.TwirpError as e:
        if e.status in (401, 403):
            return (
                f"LiveKit at {url} rejected LIVEKIT_API_KEY={key!r} / LIVEKIT_API_SECRET "
                f"({e.status} {e.code}): they must be a key pair from the server's keys"
            )
        return None
    except Exception as e:  # unreachable or not up yet: livekit-agents retries with backoff
        log.warning("LiveKit at %s not reachable yet (%s); the worker will retry", url, e)
    return None


def preflight(argv: list[str]) -> str | None:
    """One line of error for a worker command that cannot work (missing or rejected credentials), or None."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in CONNECTING_COMMANDS or "--help" in argv:
        return None
    given = dict(zip(ENV_CREDENTIALS, (_flag(argv, f) for f in ("--url", "--api-key", "--api-secret"))))
    creds = {k: given[k] or os.environ.get(k) for k in ENV_CREDENTIALS}
    missing = [k for k, v in creds.items() if not v]
    if missing:
        return f"set {', '.join(missing)} (the LiveKit server URL and an API key pair of its keys)"
    return asyncio.run(check_credentials(*creds.values()))


def _flag(argv: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``argv``."""
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def run(argv: list[str]) -> int:
    """Run livekit-agents' CLI with ``argv`` (``start``, ``dev``, ``console``, …); returns an exit code."""
    problem = preflight(argv)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    sys.argv = ["omniduplex agent", *argv]
    try:
        cli.run_app(make_server())
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return 0
