"""``omniduplex bench tools --libs``: xgrammar against llguidance on our tokenizers, for the tool grammar.

The grammar is the one the engine uses (:mod:`omniduplex.pipeline.engine.grammar`): free text in which
``<tool_call>`` opens a call block whose arguments satisfy one of the six tools' schemas
(``benchmarks/tools.yaml``), written for each library in its own terms (xgrammar: a structural tag with
triggered tags; llguidance: a Lark grammar with ``%json`` bodies, the trigger as a special token where the
vocabulary has one, else a lazy lexeme). Per library and tokenizer, each in a fresh process (so its memory is
its own): the time to build its tokenizer view, to compile the grammar, the mask fill time per token along a
reply holding a call (p50 / p90 / max over its tokens), and the resident memory the tokenizer view, grammar
and matcher add (after the library's import).
llguidance is optional (it is not a runtime dependency); a library that cannot be imported is reported so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

MODULE = "omniduplex.benchmarks.grammar_libs"
REPLY = (
    'Let me book that.\n<tool_call>\n{"name": "book_table", "arguments": {"date": "2026-11-28", "time": '
    '"19:00", "party_size": 4, "name": "Garcia"}}\n</tool_call>'
)


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def _xgrammar(tok, vocab_size: int, stop: list[int], tools: list[dict]):
    import xgrammar as xgr
    from xgrammar.structural_tag import JSONSchemaFormat, StructuralTag, TagFormat, TriggeredTagsFormat

    t0 = time.perf_counter()
    vocab = [""] * vocab_size
    for s, i in tok.get_vocab(with_added_tokens=True).items():
        if i < vocab_size:
            vocab[i] = s
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab_size, stop_token_ids=stop)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    t1 = time.perf_counter()
    tags = [
        TagFormat(
            begin=f'<tool_call>\n{{"name": "{t["name"]}", "arguments": ',
            content=JSONSchemaFormat(json_schema=t["parameters"], max_whitespace_cnt=1),
            end="}\n</tool_call>",
        )
        for t in tools
    ]
    compiled = compiler.compile_structural_tag(
        StructuralTag(format=TriggeredTagsFormat(triggers=["<tool_call>"], tags=tags))
    )
    matcher = xgr.GrammarMatcher(compiled)
    t2 = time.perf_counter()
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    return t1 - t0, t2 - t1, lambda: matcher.fill_next_token_bitmask(bitmask), matcher.accept_token


def _llguidance(tok, vocab_size: int, stop: list[int], tools: list[dict]):
    import llguidance
    import llguidance.torch as lt

    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(tok.to_str(), n_vocab=vocab_size, eos_token=stop[0])
    t1 = time.perf_counter()
    special = tok.token_to_id("<tool_call>") is not None
    rules = [f"tag_{i}" for i in range(len(tools))]
    lark = f"%llguidance {{}}\nstart: ({' | '.join(rules)})* TAG_TEXT\nTAG_TEXT: /(.|\\n)*/\n"
    for i, t in enumerate(tools):
        head = json.dumps(f'\n{{"name": "{t["name"]}", "arguments": ')
        body = f"%json {json.dumps(t['parameters'])}"
        if special:  # Qwen2.5: <tool_call> and </tool_call> are single tokens
            lark += f'tag_{i}: TAG_TEXT <tool_call> {head} {body} "}}\\n" </tool_call>\n'
        else:
            lark += f'tag_{i}_trig[lazy]: TAG_TEXT "<tool_call>"\n'
            lark += f'tag_{i}: tag_{i}_trig {head} {body} "}}\\n</tool_call>"\n'
    matcher = llguidance.LLMatcher(lltok, lark)
    if matcher.is_error():
        raise RuntimeError(matcher.get_error())
    t2 = time.perf_counter()
    bitmask = lt.allocate_token_bitmask(1, vocab_size)
    return t1 - t0, t2 - t1, lambda: lt.fill_next_token_bitmask(matcher, bitmask), matcher.consume_token


def measure(lib: str, model_dir: str) -> dict:
    """One library on one tokenizer (run in a fresh process: :func:`main`)."""
    from tokenizers import Tokenizer

    from omniduplex.benchmarks.tools import load

    __import__("xgrammar" if lib == "xgrammar" else "llguidance.torch")  # its import is not counted
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    base = _rss_mb()
    vocab_size = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    stop = [tok.token_to_id("<|im_end|>")]
    tools = load()[0]
    build = _xgrammar if lib == "xgrammar" else _llguidance
    tok_s, compile_s, fill, accept = build(tok, vocab_size, stop, tools)
    times = []
    for i in [*tok.encode(REPLY, add_special_tokens=False).ids, stop[0]]:
        t = time.perf_counter()
        fill()
        times.append(time.perf_counter() - t)
        if not accept(i):
            raise RuntimeError(f"{lib} refused token {i} of a valid reply")
    times.sort()
    q = lambda p: 1e6 * times[min(len(times) - 1, int(p * len(times)))]  # noqa: E731
    return {"lib": lib, "vocab": vocab_size, "tokenizer_s": tok_s, "compile_ms": 1000 * compile_s,
            "mask_p50_us": q(0.5), "mask_p90_us": q(0.9), "mask_max_us": 1e6 * times[-1],
            "rss_mb": _rss_mb() - base, "tokens": len(times)}  # fmt: skip


def main(manifests: list[str]) -> None:
    """Print the comparison for the LLM of each cascade manifest."""
    from omniduplex.models.cascade.manifest import load_manifest, resolve_llm
    from omniduplex.models.weights import cache_dir

    print("vocab    library     tokenizer s  compile ms  mask p50 us  p90 us  max us  RSS MB")
    for m in manifests:
        llm = resolve_llm(load_manifest(m), cache_dir())
        for lib in ("xgrammar", "llguidance"):
            call = f"measure({lib!r}, {str(llm)!r})"
            code = f"import json; from {MODULE} import measure; print(json.dumps({call}))"
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if p.returncode != 0:
                print(f"{'?':<8} {lib:<11} not measured: {p.stderr.strip().splitlines()[-1]}")
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            print(
                f"{r['vocab']:<8} {lib:<11} {r['tokenizer_s']:>11.2f}  {r['compile_ms']:>10.1f}  "
                f"{r['mask_p50_us']:>11.1f}  {r['mask_p90_us']:>6.1f}  {r['mask_max_us']:>6.0f}  "
                f"{r['rss_mb']:>6.0f}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
