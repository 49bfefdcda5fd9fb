"""The ``omniduplex`` command line (typer)."""

from __future__ import annotations

from pathlib import Path

import typer

from omniduplex.cli.bench import bench
from omniduplex.cli.models import models
from omniduplex.cli.options import PLUGIN_HELP, load_plugins

cli = typer.Typer(
    help="omniduplex: full-duplex voice assistant on a streaming speech-model pipeline.",
    no_args_is_help=True,
    add_completion=False,
)
cli.add_typer(bench, name="bench")
cli.add_typer(models)  # init-model, init-cascade, speak: top-level commands


@cli.callback()
def _root() -> None:
    """omniduplex: full-duplex voice assistant on a streaming speech-model pipeline."""


@cli.command()
def version() -> None:
    """Print the installed version."""
    from importlib.metadata import version as _v

    typer.echo(_v("omniduplex"))


@cli.command()
def respond(
    input: Path | None = typer.Option(
        None, "--input", "-i", help="Spoken question: WAV/FLAC, any rate or channel count."
    ),
    output: Path = typer.Option(
        Path("answer.wav"), "--output", "-o", help="Where to write the answer (24 kHz, or the DAC rate)."
    ),
    model: Path | None = typer.Option(
        None,
        help="Checkpoint directory or cascade manifest (default: the cascade on the packaged real weights; "
        "'tiny' = the tiny random Qwen3-Omni checkpoint).",
    ),
    graph: Path | None = typer.Option(None, help="Stage-graph YAML (default: the shipped one)."),
    greedy: bool = typer.Option(False, "--greedy", help="Greedy decoding in every LM stage."),
    system_prompt: str | None = typer.Option(
        None, "--system-prompt", help="Cascade: the LLM's system prompt."
    ),
    dump_tokens: Path | None = typer.Option(
        None, "--dump-tokens", help="Write the prompt ids, text ids and codec frames as JSON."
    ),
    max_tokens: int = typer.Option(64, help="LLM / Thinker max new tokens."),
    talker_max_tokens: int = typer.Option(
        128, help="Talker max codec frames incl. EOS (12.5 frames = 1 s; random tiny weights rarely stop)."
    ),
    speaker: str = typer.Option("ethan", help="Voice (talker_config.speaker_id key)."),
    processes: bool = typer.Option(
        True,
        "--processes/--in-process",
        help="Run each stage in its own process (relay) or all in this one.",
    ),
    prompt: str | None = typer.Option(
        None, help="Unified checkpoints: user text before the speech (alone = a text-only turn)."
    ),
    cfg_scale: float = typer.Option(1.0, "--cfg-scale", help="Unified checkpoints: CFG guidance scale w."),
    max_audio_frames: int = typer.Option(64, help="Unified checkpoints: max codec frames."),
    start_timeout: float = typer.Option(
        180.0, "--start-timeout", min=1, help="Report a stage process not yet ready after this long (s)."
    ),
) -> None:
    """Answer one spoken turn: prints the transcript as it streams, then TTFP, E2EL, RTF, audio seconds."""
    from omniduplex.app.host.pipeline import RespondOptions
    from omniduplex.cli.respond import respond as run

    opts = RespondOptions(
        greedy=greedy,
        system_prompt=system_prompt,
        max_tokens=max_tokens,
        talker_max_tokens=talker_max_tokens,
        speaker=speaker,
        user_text=prompt,
        cfg_scale=cfg_scale,
        max_audio_frames=max_audio_frames,
    )
    raise typer.Exit(run(input, output, model, graph, opts, dump_tokens, processes, start_timeout))


@cli.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, help="HTTP port (page, signalling, health)."),
    max_sessions: int = typer.Option(8, "--max-sessions", min=1, help="Concurrent sessions; more get 503."),
    api_key: list[str] | None = typer.Option(
        None, "--api-key", help="Accepted API key (repeatable; also $OMNIDUPLEX_API_KEYS). None: no auth."
    ),
    api_keys_file: Path | None = typer.Option(
        None, "--api-keys-file", help="File of API keys, one per line."
    ),
    insecure: bool = typer.Option(False, "--insecure", help="Allow a non-loopback --host without API keys."),
    sessions_per_key: int = typer.Option(
        0, "--sessions-per-key", min=0, help="Sessions per key (0: no limit)."
    ),
    connections_per_minute: int = typer.Option(
        60,
        "--connections-per-minute",
        min=0,
        help="New sessions per client address per minute (0: no limit).",
    ),
    model: Path | None = typer.Option(
        None,
        help="Checkpoint directory or cascade manifest (default: the cascade on the packaged real weights; "
        "'tiny' = the tiny random Qwen3-Omni checkpoint; a Moshi folder: only that duplex model).",
    ),
    graph: Path | None = typer.Option(None, help="Stage-graph YAML (default: the shipped one)."),
    duplex_model: Path | None = typer.Option(
        None,
        "--duplex-model",
        help="A Moshi checkpoint folder (init-model --arch moshi-tiny) served full duplex on "
        "ws /v1/realtime?duplex=1 beside the cascade.",
    ),
    duplex_sessions: int = typer.Option(4, "--duplex-sessions", min=1, help="Duplex engine rows."),
    duplex_resume_s: float = typer.Option(
        30.0,
        "--duplex-resume-s",
        min=0.0,
        help="Grace period (s) a dropped /v1/realtime?duplex=1 session waits for session.resume.",
    ),
    duplex_threads: int = typer.Option(
        1, "--duplex-threads", min=1, help="torch threads of the duplex engine's ticking thread."
    ),
    duplex_surfaces: str | None = typer.Option(
        None,
        "--duplex-surfaces",
        help="Comma-separated surfaces (browser, kiosk, phone) whose calls run the --duplex-model "
        "instead of the cascade by default (a call may still choose: POST /offer {duplex}, "
        "/phone/twilio/stream?duplex=0|1).",
    ),
    system_prompt: str | None = typer.Option(
        None, "--system-prompt", help="Cascade: the LLM's system prompt."
    ),
    processes: bool | None = typer.Option(
        None,
        "--processes/--in-process",
        help="Stage processes joined by the relay, or all stages in this process "
        "(default: processes when the process backend is available).",
    ),
    turn_detection: str = typer.Option(
        "silence",
        "--turn-detection",
        help="End of turn: 'silence' (endpoint after --endpoint-ms of silence) or 'smart' (Smart Turn v3 "
        "model: commits as soon as the sentence sounds finished, waits through mid-sentence pauses).",
    ),
    endpoint_ms: int = typer.Option(500, help="Silence that ends a user turn (ms)."),
    preemptive_ms: int = typer.Option(
        200, help="Silence after which the reply starts before the turn ends, held until then (ms, 0 = off)."
    ),
    barge_in_ms: int = typer.Option(300, help="Speech over a reply that interrupts it (ms)."),
    min_turn_ms: int = typer.Option(200, help="Shortest speech committed as a turn (ms)."),
    vad_aggressiveness: int = typer.Option(2, min=0, max=3, help="webrtcvad mode, 0 (lenient) … 3 (strict)."),
    max_tokens: int = typer.Option(64, help="LLM / Thinker max new tokens per reply."),
    talker_max_tokens: int = typer.Option(125, help="Talker max codec frames per reply (12.5 frames = 1 s)."),
    speaker: str = typer.Option("ethan", help="Voice (talker_config.speaker_id key)."),
    media_timeout: float = typer.Option(5.0, help="End a session after this long without client audio (s)."),
    tts: list[Path] | None = typer.Option(
        None,
        "--tts",
        help="TTS checkpoint serving POST /v1/audio/speech (a registered family's: Qwen3-TTS, VoxCPM2, Higgs "
        "Audio v3, Fish Speech S2 Pro, a --plugin's; repeatable: a request's model names one by its folder; "
        "default: the Piper voice).",
    ),
    plugin: list[str] | None = typer.Option(None, "--plugin", help=PLUGIN_HELP),
    tts_graph: bool = typer.Option(
        False,
        "--tts-graph",
        help="Serve --tts on the Qwen3-TTS graph: talker and codec decoder in two stage processes, "
        "concurrent requests' chunks decoded together (default: one engine thread in the server).",
    ),
    drain_timeout: float = typer.Option(
        30.0, "--drain-timeout", min=0, help="SIGTERM: wait for replies in flight this long (s)."
    ),
    start_timeout: float = typer.Option(
        180.0,
        "--start-timeout",
        min=1,
        help="A stage process not ready after this long is reported late in /readyz and the log; the server "
        "keeps waiting for it, answering 'server not ready' meanwhile (s).",
    ),
    sip: str | None = typer.Option(None, "--sip", help="Also answer SIP calls on HOST:PORT (UDP and TCP)."),
    rtp_ports: str = typer.Option("10000-10100", "--rtp-ports", help="SIP: local RTP port range LOW-HIGH."),
    max_calls: int = typer.Option(8, "--max-calls", min=1, help="SIP: concurrent calls; more get 503."),
    sip_user: list[str] | None = typer.Option(
        None, "--sip-user", help="SIP digest credentials USER:PASSWORD (repeatable); none = no digest."
    ),
    sip_allow: list[str] | None = typer.Option(
        None, "--sip-allow", help="SIP: source IP admitted without digest (repeatable)."
    ),
    mcp: list[str] | None = typer.Option(
        None,
        "--mcp",
        help="MCP tool server for the voice surfaces: NAME=URL (streamable HTTP) or NAME=COMMAND (stdio); "
        "NAME[tool1,tool2]=... allows only those tools (repeatable).",
    ),
    mcp_allow_url: list[str] | None = typer.Option(
        None, "--mcp-allow-url", help="URL prefix a Realtime client may give as MCP server_url (repeatable)."
    ),
    max_tool_calls: int = typer.Option(4, "--max-tool-calls", min=1, help="Tool calls per user turn."),
    tool_choice: str = typer.Option(
        "auto", "--tool-choice", help="Voice sessions' use of the --mcp tools: auto, required, none or NAME."
    ),
    tool_filler_ms: int = typer.Option(
        800, "--tool-filler-ms", min=0, help="A tool slower than this gets a spoken filler (ms, 0 = never)."
    ),
    log_level: str = typer.Option("info", help="debug, info, warning."),
    log_json: bool = typer.Option(
        False, "--log-json", help="One JSON object per log line (time, level, logger, message, ids)."
    ),
) -> None:
    """Serve the browser voice chat (WebRTC, full duplex, barge-in) at http://HOST:PORT/, the OpenAI
    Realtime API at /v1/realtime, the Twilio media-stream bridge at /phone/twilio/* ($TWILIO_AUTH_TOKEN:
    check signatures), with --sip SIP calls. Beyond loopback it needs API keys (or --insecure)."""
    from omniduplex.app.core.session import SessionConfig
    from omniduplex.app.core.vad import TurnConfig
    from omniduplex.app.host.auth import AuthConfig, AuthConfigError, check_bind, load_keys
    from omniduplex.app.host.config import tools_config, voice_tool_choice
    from omniduplex.app.server import ServerConfig
    from omniduplex.app.server import serve as run
    from omniduplex.app.surfaces.phone.config import SipConfig

    if turn_detection not in ("silence", "smart"):
        raise typer.BadParameter(f"--turn-detection {turn_detection!r}: choose silence or smart")
    load_plugins(plugin)
    from omniduplex.pipeline.speech.registry import family_of, known

    for d in tts or []:
        if family_of(d) is None:
            raise typer.BadParameter(f"--tts {d}: not a checkpoint of a registered TTS family ({known()})")
    from omniduplex.app.host.duplex import is_moshi_folder

    duplex_only = model is not None and is_moshi_folder(model)  # the duplex model only, no cascade
    if duplex_model is not None and not is_moshi_folder(duplex_model):
        raise typer.BadParameter(
            f"--duplex-model {duplex_model}: not a Moshi checkpoint folder (config.json)"
        )
    from omniduplex.app.host.config import parse_duplex_surfaces

    try:
        served = duplex_model or (model if duplex_only else None)
        surfaces = parse_duplex_surfaces(duplex_surfaces, str(served) if served else None)
    except ValueError as e:
        raise typer.BadParameter(f"--duplex-surfaces: {e}") from None
    turn = TurnConfig(
        endpoint_ms=endpoint_ms,
        preemptive_ms=preemptive_ms,
        barge_in_ms=barge_in_ms,
        min_turn_ms=min_turn_ms,
        turn_detection=turn_detection,
    )
    cfg = ServerConfig(
        max_sessions=max_sessions,
        session=SessionConfig(turn=turn, vad_aggressiveness=vad_aggressiveness),
        model=str(model) if model else None,
        graph=str(graph) if graph else None,
        duplex_model=str(duplex_model) if duplex_model else None,
        duplex_sessions=duplex_sessions,
        duplex_resume_s=duplex_resume_s,
        duplex_threads=duplex_threads,
        duplex_surfaces=surfaces,
        processes=processes,
        max_tokens=max_tokens,
        talker_max_tokens=talker_max_tokens,
        speaker=speaker,
        system_prompt=system_prompt,
        tts=[str(d) for d in tts] if tts else None,
        tts_graph=tts_graph,
        media_timeout_s=media_timeout,
        drain_timeout_s=drain_timeout,
        start_timeout_s=start_timeout,
    )
    if duplex_only:
        from omniduplex.app.host.config import duplex_only_config

        try:
            duplex_only_config(cfg, str(model))
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    try:
        cfg.tools = tools_config(mcp or [], mcp_allow_url or [], max_tool_calls, tool_filler_ms)
        cfg.session.tool_choice = voice_tool_choice(tool_choice, mcp or [])
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if sip:
        users = dict(u.split(":", 1) for u in sip_user or [] if ":" in u)
        try:
            cfg.sip = SipConfig.parse(sip, rtp_ports, max_calls=max_calls, users=users, allow=sip_allow or [])
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    try:
        cfg.auth = AuthConfig(
            api_keys=load_keys(api_key, api_keys_file),
            sessions_per_key=sessions_per_key,
            connections_per_minute=connections_per_minute,
        )
        check_bind(host, cfg.auth, insecure)
    except AuthConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    run(cfg, host, port, log_level, log_json)


@cli.command()
def kiosk(
    config: Path | None = typer.Option(None, "--config", help="Server config YAML with a 'kiosk:' section."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, help="HTTP port."),
    model: Path | None = typer.Option(None, help="Checkpoint directory or cascade manifest (as for serve)."),
    max_sessions: int = typer.Option(2, "--max-sessions", min=1, help="Concurrent sessions; more get 503."),
    title: str | None = typer.Option(None, help="Page title (overrides the config)."),
    greeting: str | None = typer.Option(None, help="Attract-screen greeting the assistant says on a tap."),
    system_prompt: str | None = typer.Option(None, "--system-prompt", help="The assistant's system prompt."),
    voice: str | None = typer.Option(None, help="TTS voice / speaker key."),
    turn_detection: str | None = typer.Option(None, "--turn-detection", help="silence or smart."),
    idle_timeout: float | None = typer.Option(None, help="Reset conversation and captions after idle (s)."),
    attract_after: float | None = typer.Option(None, help="Show the attract screen after idle (s)."),
    push_to_talk: bool | None = typer.Option(
        None, "--push-to-talk/--hands-free", help="Hold space / touch to talk (default: hands-free)."
    ),
    processes: bool | None = typer.Option(None, "--processes/--in-process", help="As for serve."),
    api_key: list[str] | None = typer.Option(None, "--api-key", help="As for serve (repeatable)."),
    api_keys_file: Path | None = typer.Option(None, "--api-keys-file", help="As for serve."),
    insecure: bool = typer.Option(False, "--insecure", help="Allow a non-loopback --host without API keys."),
    log_level: str = typer.Option("info", help="debug, info, warning."),
) -> None:
    """Serve the full-screen, hands-free voice kiosk at http://HOST:PORT/kiosk (serve with kiosk defaults)
    and print the Chromium command line that opens it unattended. With API keys the page needs ?token=KEY."""
    from omniduplex.app.host.auth import AuthConfig, AuthConfigError, check_bind, load_keys
    from omniduplex.app.server import kiosk_server_config
    from omniduplex.app.server import serve as run
    from omniduplex.app.surfaces.kiosk.config import (
        chromium_command,
        kiosk_url,
        load_kiosk_config,
        shell_line,
    )

    try:
        kcfg = load_kiosk_config(
            config,
            title=title,
            greeting=greeting,
            system_prompt=system_prompt,
            voice=voice,
            turn_detection=turn_detection,
            idle_timeout_s=idle_timeout,
            attract_after_s=attract_after,
            push_to_talk=push_to_talk,
        )
    except (OSError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    cfg = kiosk_server_config(
        kcfg, max_sessions=max_sessions, model=str(model) if model else None, processes=processes
    )
    from omniduplex.app.host.duplex import is_moshi_folder

    if model is not None and is_moshi_folder(model):  # the kiosk on the duplex model alone, as for serve
        from omniduplex.app.host.config import duplex_only_config

        duplex_only_config(cfg, str(model))
    try:
        cfg.auth = AuthConfig(api_keys=load_keys(api_key, api_keys_file))
        check_bind(host, cfg.auth, insecure)
    except AuthConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    url = kiosk_url(host, port)
    typer.echo(f"kiosk: {url}")
    if cfg.auth.enabled:
        typer.echo("the server needs an API key: add ?token=KEY to the URL (a key; tokens expire)")
    typer.echo(f"open it unattended with:\n  {shell_line(chromium_command(url))}")
    run(cfg, host, port, log_level)


@cli.command(context_settings={"allow_extra_args": True, "allow_interspersed_args": False})
def agent(
    ctx: typer.Context,
    command: str | None = typer.Argument(None, metavar="COMMAND", help="start, dev, console or connect."),
    realtime_url: str | None = typer.Option(
        None,
        "--realtime-url",
        envvar="OMNIDUPLEX_REALTIME_URL",
        help="Remote mode: a server's ws://HOST:PORT/v1/realtime (unset: the pipeline in this process).",
    ),
    realtime_key: str | None = typer.Option(
        None, "--realtime-key", envvar="OMNIDUPLEX_API_KEY", help="Remote mode: an API key of that server."
    ),
    model: str | None = typer.Option(
        None, "--model", envvar="OMNIDUPLEX_MODEL", help="In-process: checkpoint, cascade manifest or 'tiny'."
    ),
    instructions: str | None = typer.Option(
        None, "--instructions", envvar="OMNIDUPLEX_INSTRUCTIONS", help="The agent's system prompt."
    ),
    greeting: str | None = typer.Option(
        None, "--greeting", envvar="OMNIDUPLEX_GREETING", help="Instructions for a first reply on joining."
    ),
    mcp: list[str] | None = typer.Option(
        None,
        "--mcp",
        help="MCP tool server of every room's session, as serve --mcp: NAME=URL (streamable HTTP) or "
        "NAME=COMMAND (stdio); NAME[tool1,tool2]=... allows only those tools (repeatable).",
    ),
) -> None:
    """LiveKit agent worker with the pipeline as its realtime model: COMMAND is livekit-agents' own
    (start, dev, console, connect; `omniduplex agent start --help`). Needs LIVEKIT_URL, LIVEKIT_API_KEY,
    LIVEKIT_API_SECRET (and optionally LIVEKIT_AGENT_NAME for explicit dispatch)."""
    import os

    try:
        from omniduplex.app.surfaces.livekit.worker import run as run_worker
    except ImportError as e:
        typer.echo(f"error: livekit-agents is missing ({e}): pip install 'omniduplex[livekit]'", err=True)
        raise typer.Exit(2) from None
    from omniduplex.app.surfaces.livekit.mcp_servers import ENV as MCP_ENV
    from omniduplex.app.surfaces.livekit.mcp_servers import parse_specs

    try:
        parse_specs(mcp or [])
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    settings = {
        "OMNIDUPLEX_REALTIME_URL": realtime_url,
        "OMNIDUPLEX_API_KEY": realtime_key,
        "OMNIDUPLEX_MODEL": model,
        "OMNIDUPLEX_INSTRUCTIONS": instructions,
        "OMNIDUPLEX_GREETING": greeting,
        MCP_ENV: "\n".join(mcp or []),
    }
    os.environ.update({k: v for k, v in settings.items() if v})  # job processes inherit them
    raise typer.Exit(run_worker([command, *ctx.args] if command else list(ctx.args)))


def main() -> None:
    """Entry point of the ``omniduplex`` console script: a known error (:mod:`omniduplex.cli.errors`: bad
    checkpoint, config, weights, audio, auth setup, a stage that did not start) is printed as one line,
    without a traceback, and exits with code 1."""
    try:
        cli()
    except Exception as e:
        from omniduplex.cli.errors import one_line

        line = one_line(e)
        if line is None:
            raise
        typer.echo(f"error: {line}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
