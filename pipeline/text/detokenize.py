"""Incremental detokenization: the text each new token id adds, in time linear in the reply length.

Decoding every id so far at every token costs ``O(n)`` per token, ``O(n²)`` per reply. Here each new id
decodes a short window of recent ids (the prefix-offset / read-offset scheme of streaming LLM servers):

* ``prefix`` is the first id of the previously emitted chunk and ``read`` the end of the emitted ids. The
  delta is ``decode(ids[prefix:])[len(decode(ids[prefix:read])):]``: starting one chunk back keeps what a
  tokenizer does at a window start (a SentencePiece ``▁`` dropped as a leading space, byte-level BPE bytes
  of a character split across tokens) out of the delta.
* A decode ending in ``\\ufffd`` (a UTF-8 sequence still split across tokens) is held back until the next id
  completes it; special tokens (skipped in the text) are dropped at once.

With valid UTF-8 output every character completes within 4 ids, so each push decodes at most a few ids
(:attr:`IncrementalDetokenizer.num_decoded_ids` counts them) and the deltas, after :meth:`flush`,
concatenate to ``tokenizer.decode(all_ids, skip_special_tokens=True)``.
"""

from __future__ import annotations

from tokenizers import Tokenizer


class IncrementalDetokenizer:
    """Text deltas of a growing id sequence, each decoded from a short window of recent ids.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.

    Attributes:
        num_decoded_ids: ids passed to ``tokenizer.decode`` so far (the work done; bounded per id).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # window start: first id of the last emitted chunk
        self.read = 0  # ids up to here are emitted
        self.num_decoded_ids = 0
        self._special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}

    def _decode(self, start: int, end: int) -> str:
        self.num_decoded_ids += end - start
        return self.tok.decode(self.ids[start:end], skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Append one id; returns the text it completes (``""`` while a character is split, or for a special
        token)."""
        if token_id in self._special:
            return ""
        self.ids.append(token_id)
        done = self._decode(self.prefix, self.read)
        text = self._decode(self.prefix, len(self.ids))
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(done) :]

    def push_many(self, ids: list[int], final: bool = False) -> str:
        """Push every id of ``ids``; with ``final``, also :meth:`flush`. Returns the text they complete."""
        out = "".join(self.push(i) for i in ids)
        return out + self.flush() if final else out

    def flush(self) -> str:
        """Whatever is still held back (an unfinished UTF-8 sequence decodes with ``\\ufffd``)."""
        done = self._decode(self.prefix, self.read)
        text = self._decode(self.prefix, len(self.ids))
        self.prefix = self.read = len(self.ids)
        return text[len(done) :] if len(text) > len(done) else ""
