"""Incremental detokenization: the deltas concatenate to the full decode, and the work per token is bounded.

Two tokenizers built here cover the two families in use: byte-level BPE (GPT-2 / SmolLM2 / Qwen) and
SentencePiece-style (``▁`` for spaces, byte-fallback ``<0xNN>`` pieces, leading space stripped; Llama).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from omniduplex.pipeline.text.detokenize import IncrementalDetokenizer

SPECIALS = ["<|im_start|>", "<|im_end|>"]


def byte_level() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [("Ġ", "h"), ("Ġh", "e"), ("l", "l"), ("Ġhe", "ll"), ("o", "!"), ("æ", "Ŀ")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def sentencepiece_like() -> Tokenizer:
    pieces = ["<unk>", "▁", "▁Hello", "▁world", "!", "▁na", "ï", "ve", "a", "b"]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(SPECIALS)
    return tok


TOKENIZERS = {"byte_level": byte_level(), "sentencepiece": sentencepiece_like()}


def stream(tok: Tokenizer, ids: list[int]) -> tuple[list[str], list[int]]:
    """Deltas (flush last) and the ids decoded by each push."""
    d = IncrementalDetokenizer(tok)
    deltas, work = [], []
    for i in ids:
        before = d.num_decoded_ids
        deltas.append(d.push(i))
        work.append(d.num_decoded_ids - before)
    deltas.append(d.flush())
    return deltas, work


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_byte_level_deltas_concatenate_to_the_full_decode_for_any_ids(data):
    """Any ids, specials and invalid UTF-8 byte runs included."""
    tok = TOKENIZERS["byte_level"]
    ids = data.draw(st.lists(st.integers(0, tok.get_vocab_size() - 1), max_size=60))
    deltas, _ = stream(tok, ids)
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_sentencepiece_deltas_concatenate_to_the_full_decode(data):
    """Random pieces, specials and multi-byte characters spelled as byte-fallback pieces. (Not invalid byte
    runs: ``ByteFallback`` then turns every byte of the run into U+FFFD, bytes already shown included, which
    no streaming decoder can take back; model outputs are valid UTF-8.)"""
    tok = TOKENIZERS["sentencepiece"]
    v = tok.get_vocab()
    words = [p for p in v if not p.startswith("<")] + SPECIALS
    chars = st.characters(codec="utf-8", exclude_categories=("Cs",))
    ids: list[int] = []
    for item in data.draw(st.lists(st.one_of(st.sampled_from(words), chars), max_size=40)):
        if item in v:
            ids.append(v[item])
        else:
            ids += [v[f"<0x{b:02X}>"] for b in item.encode()]
    deltas, work = stream(tok, ids)
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)
    assert max(work, default=0) <= 16


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\ufffd")))
def test_multibyte_text_streams_exactly_with_bounded_work_per_token(text):
    tok = TOKENIZERS["byte_level"]
    ids = tok.encode(text).ids
    deltas, work = stream(tok, ids)
    assert "".join(deltas) == text == tok.decode(ids)
    assert not any("\ufffd" in d for d in deltas)  # split characters are held back, never shown broken
    # each id decodes a window of the previous chunk and the pending ids: a character spans <= 4 byte
    # tokens here, so a push decodes at most 2 windows of <= 8 ids, whatever the reply length
    assert max(work, default=0) <= 16 and sum(work) <= 16 * len(ids) + 16


def test_work_is_linear_in_the_reply_length():
    tok = TOKENIZERS["byte_level"]
    ids = tok.encode("hello! 東京 naïve café 😀 " * 60).ids
    _, work = stream(tok, ids)
    n = len(ids)
    assert n > 600
    assert sum(work) <= 8 * n < n * (n + 1) // 2 // 20  # far from decoding every id so far at every token


def test_sentencepiece_leading_spaces_and_byte_fallback():
    tok = TOKENIZERS["sentencepiece"]
    v = tok.get_vocab()
    ids = [v["▁Hello"], v["▁world"], v["!"], v["▁na"], v["ï"], v["ve"], v["▁"]]
    ids += [v["<0xE6>"], v["<0x9D>"], v["<0xB1>"], v["<|im_end|>"], v["a"]]  # 東 from three byte pieces
    deltas, work = stream(tok, ids)
    assert "".join(deltas) == "Hello world! naïve 東a" == tok.decode(ids, skip_special_tokens=True)
    assert deltas[:2] == ["Hello", " world"]  # "▁world" keeps its space: the window starts a chunk back
    assert deltas[7:9] == ["", ""] and deltas[9] == "東"  # held until the character is whole
    assert deltas[10] == ""  # a special token adds nothing and is not kept in the window
    assert max(work) <= 10
