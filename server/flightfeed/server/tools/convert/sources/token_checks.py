"""Is a flat token file what ``--eot`` and ``--token-dtype`` say it is?

A nanoGPT-style ``train.bin`` has no header: a wrong ``--token-dtype`` or ``--eot`` reads as
well-formed documents of wrong tokens, and a file cut inside its last document reads as one
document fewer tokens long. nanoGPT's ``prepare.py`` appends the end-of-text id after every
document, so each file is checked for what that layout promises, on the file's last token, a fixed
sample and the document count the scan finds anyway (no measurable time on a 1 GB file):

0. **header**: llm.c's and modded-nanogpt's ``fineweb_train_*.bin`` shards look like nanoGPT's but
   start with a 1,024-byte header (256 int32, the first a magic number) and put the end-of-text id
   *before* each document: a file starting with their magic is refused naming that layout;
1. **width**: read as ``DTYPE``, a file of tokens twice as wide shows every other value as the
   high half of a token (little-endian), which is 0..3 for every vocabulary under 262,144 ids. If
   every odd-placed token of a sample is 0..3 while the even-placed ones are not, the file is refused
   naming the wider ``--token-dtype``;
2. **end**: the last token must be the ``--eot`` id (else the file is cut inside its last document,
   or ``--eot`` / ``--token-dtype`` is wrong);
3. **rate**: documents must average between :data:`MIN_MEAN_TOKENS` and :data:`MAX_MEAN_TOKENS`
   tokens: an id that ends documents every few tokens, or only once in millions, is no end-of-text
   (the lower bound from :data:`MIN_RATE_DOCUMENTS` documents on: a toy file of a few short
   documents converts).

Each refusal is one :class:`~flightfeed.wire.errors.DatasetError` line naming the file, the flag and
what to pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from flightfeed.wire.errors import DatasetError

__all__ = [
    "check_layout",
    "check_rate",
    "MIN_MEAN_TOKENS",
    "MIN_RATE_DOCUMENTS",
    "MAX_MEAN_TOKENS",
    "SAMPLE_SPOTS",
    "SPOT_TOKENS",
]

#: documents shorter than this on average: the id is a frequent token (or the high halves of wide tokens)
MIN_MEAN_TOKENS = 4
#: the lower bound applies to files of at least this many documents
MIN_RATE_DOCUMENTS = 64
#: documents longer than this on average (4,194,304 tokens): the id is not the one written after each
MAX_MEAN_TOKENS = 1 << 22
#: the width check reads this many runs of SPOT_TOKENS tokens, spread over the file
SAMPLE_SPOTS = 16
SPOT_TOKENS = 4096
#: fewer token pairs than this in the sample: too few to tell (the end check still applies)
_MIN_PAIRS = 64
#: the wider dtype a file read as DTYPE may really hold
_WIDER = {"uint16": "uint32", "uint32": "int64", "int32": "int64"}
#: llm.c's data files (dev/data/data_common.py): GPT-2 (uint16) and Llama 3 (uint32) magic numbers
_LLMC_MAGIC = (20240520, 20240801)
_LLMC_HEADER_BYTES = 1024
_NANOGPT = "nanoGPT's prepare.py appends it after every document (GPT-2: --eot 50256 --token-dtype uint16)"


def _sample(tokens: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Up to SAMPLE_SPOTS runs of SPOT_TOKENS tokens spread over ``tokens``, each starting at an even
    place (so odd places in the sample are odd places in the file)."""
    n = len(tokens) - len(tokens) % 2
    if n <= SAMPLE_SPOTS * SPOT_TOKENS:
        return tokens[:n]
    starts = np.linspace(0, n - SPOT_TOKENS, SAMPLE_SPOTS).astype(np.int64) // 2 * 2
    return np.concatenate([tokens[s : s + SPOT_TOKENS] for s in starts.tolist()])


def check_layout(path: str, tokens: npt.NDArray[Any], eot: int) -> None:
    """The header, width and end checks: before the scan, from the first bytes, a sample and the
    last token."""
    dtype = tokens.dtype
    if tokens.nbytes >= _LLMC_HEADER_BYTES:
        magic = int.from_bytes(tokens[: max(1, 4 // dtype.itemsize)].tobytes()[:4], "little", signed=True)
        if magic in _LLMC_MAGIC:
            raise DatasetError(
                f"{path}: starts with the 1024-byte header of an llm.c / modded-nanogpt token shard (magic "
                f"{magic}), not a headerless nanoGPT file; those shards put the end-of-text id before each "
                "document: write the tokens without the header, each document followed by --eot, as nanoGPT's "
                "prepare.py does"
            )
    wide = _WIDER.get(dtype.name)
    if wide is not None:
        sample = _sample(tokens)
        odd, even = sample[1::2], sample[0::2]
        if len(odd) >= _MIN_PAIRS and int(odd.max()) <= 3 and int(even.max()) > 3:
            raise DatasetError(
                f"{path}: read as --token-dtype {dtype}, every other token is 0-3, as the high halves of "
                f"{wide} tokens are; pass --token-dtype {wide}"
            )
    last = int(tokens[-1])
    if last != eot:
        raise DatasetError(
            f"{path}: does not end with the end-of-text id --eot {eot} (its last token is {last}): the file is "
            f"cut inside its last document, or --eot / --token-dtype {dtype} is not what its tokenizer wrote; "
            f"{_NANOGPT}"
        )


def check_rate(path: str, tokens: int, documents: int, eot: int, dtype: np.dtype[Any]) -> None:
    """The rate check: ``documents`` end-of-text ids in ``tokens`` tokens must be a plausible rate."""
    mean = tokens / max(1, documents)
    if (mean >= MIN_MEAN_TOKENS or documents < MIN_RATE_DOCUMENTS) and mean <= MAX_MEAN_TOKENS:
        return
    bound = f"under {MIN_MEAN_TOKENS}" if mean < MIN_MEAN_TOKENS else f"over {MAX_MEAN_TOKENS:,}"
    raise DatasetError(
        f"{path}: --eot {eot} ends {documents:,} document(s) in {tokens:,} tokens ({mean:,.1f} tokens each, "
        f"{bound}): not an end-of-text id's rate; give the id the tokenizer wrote after each document and "
        f"the --token-dtype it wrote (now {dtype}); {_NANOGPT}"
    )
