"""Named offline prompt sources: spans of exactly T tokens, sampled reproducibly.

A spec names sources and counts, e.g. ``"prose:2000,code:2000,random:1000"``; a source is a name
from ``CORPORA`` or a user file ``path.txt`` (one prompt per line) / ``path.jsonl`` (a ``text``
field). Text sources are cut into token spans under the given tokenizer (no special tokens);
``random`` draws uniform ids over the vocabulary without special/added tokens. A file without a
count (``prompts.txt``) means every line, in file order: each line one prompt of its own length, or,
when a length is asked for, every non-overlapping span of that length. Every prompt of one
``sample`` call is a distinct id sequence (repeated lines are dropped).
"""

import bz2
import html
import importlib.util
import json
import os
import random
import re
import sysconfig
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .io import SipitError

DEFAULT_LENGTH = 20  # tokens per prompt when no length is asked for (whole-line files excepted)
SPEC_HELP = ("NAME:N (e.g. prose:100), FILE.txt:N or FILE.jsonl:N (N spans of your text), "
             "or FILE.txt / FILE.jsonl (every line as a prompt)")
CHUNK = 4000  # characters; long documents are cut (at line ends) into pieces this size
POOL = 2  # read text until there are POOL * N distinct non-overlapping spans to choose from
FORTUNES_DIR = "/usr/share/games/fortunes"  # Debian package `fortunes`
WORDNET_DIR = "/usr/share/wordnet"  # Debian package `wordnet-base`


@dataclass
class Prompt:
    """One prompt: `ids` are the truth; `text` is their decoding (re-encoding it may differ)."""

    ids: list[int]
    text: str
    source: str


class CorpusError(SipitError, ValueError):
    """A corpus spec that cannot be served: unknown name, bad spec, too few distinct spans."""


class Unavailable(CorpusError):
    """A named corpus whose data is not installed on this machine."""


# ---------------------------------------------------------------- finding and reading sources

def _package_file(package: str, relpath: str, pip_name: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    path = Path(spec.submodule_search_locations[0]) / relpath if spec else None
    if path is None or not path.exists():
        raise Unavailable(f"needs the PyPI package {pip_name!r} (pip install --no-deps {pip_name})")
    return path


def _system_dir(path: str, apt_name: str) -> Path:
    if not os.path.isdir(path):
        raise Unavailable(f"needs the Debian package {apt_name!r} (apt-get install {apt_name})")
    return Path(path)


def _chunks(text: str, size: int = CHUNK) -> list[str]:
    """Cut text at line ends into pieces of about `size` characters (a longer line stays whole)."""
    out, cur, n = [], [], 0
    for line in text.splitlines():
        if cur and n + len(line) > size:
            out.append("\n".join(cur))
            cur, n = [], 0
        cur.append(line)
        n += len(line) + 1
    if cur:
        out.append("\n".join(cur))
    return [c for c in out if c.strip()]


def _cached_chunks(read):
    """Decorator: read(path) -> documents becomes path -> all their chunks, built once per process."""
    @lru_cache(maxsize=None)
    def chunks(path):
        return tuple(c for doc in read(path) for c in _chunks(doc))
    return chunks


def _shuffled(rng: random.Random, chunks, path):
    """The chunks of an in-memory source in a seeded random order (read on first use)."""
    order = list(chunks(path))
    rng.shuffle(order)
    yield from order


def _clean_wiki(text: str) -> str:
    """Plain paragraphs from MediaWiki markup: drop templates, tables, refs, files; keep prose."""
    text = re.sub(r"<!--.*?-->|<ref[^>]*/>|<ref.*?</ref>|<gallery.*?</gallery>", "", text, flags=re.S)
    for pattern in (r"\{\{[^{}]*\}\}", r"\{\|[^{}]*?\|\}"):
        while (new := re.sub(pattern, "", text, flags=re.S)) != text:
            text = new
    link = lambda m: "" if re.match(r"\w+:", m[1]) else m[1].split("|")[-1]  # noqa: E731
    while (new := re.sub(r"\[\[([^\[\]]*)\]\]", link, text)) != text:
        text = new
    text = re.sub(r"\[https?://\S+ ([^\]]*)\]|\[https?://\S+\]", r"\1", text)
    text = html.unescape(re.sub(r"<[^>]+>|'{2,}", "", text))
    text = re.sub(r" {2,}", " ", re.sub(r" ?\([\s;,]*\)", "", text))  # left by removed templates
    keep = [s.strip() for s in text.splitlines()]
    return "\n".join(s for s in keep if len(s) >= 60 and s[0] not in "=*#:;|!{}")


@_cached_chunks
def _prose_docs(wiki: Path) -> list[str]:
    """Wikipedia articles (markup removed) and the Lee news corpus, both from gensim's test data."""
    root = ET.fromstring(bz2.open(wiki).read())
    articles = (_clean_wiki(el.text or "") for el in root.iter() if el.tag.endswith("}text"))
    return [*filter(None, articles), *(wiki.parent / "lee_background.cor").read_text().splitlines()]


def _prose(rng):
    wiki = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    return _shuffled(rng, _prose_docs, _package_file("gensim", wiki, "gensim"))


@_cached_chunks
def _chat_docs(path: Path) -> list[str]:
    """One document per conversation, one message per line."""
    data = json.loads(path.read_text())
    return ["\n".join(u["text"] for turn in c["messages"] for u in turn) for c in data.values()]


def _chat(rng):
    return _shuffled(rng, _chat_docs, _package_file("chitchat_dataset", "dataset.json", "chitchat-dataset"))


@_cached_chunks
def _tech_docs(path: Path) -> list[str]:
    from pydoc_data.topics import topics
    return list(topics.values())


def _tech(rng):
    if importlib.util.find_spec("pydoc_data") is None:
        raise Unavailable("needs the standard library module pydoc_data")
    return _shuffled(rng, _tech_docs, "pydoc_data.topics")


def _code(rng):
    """Standard-library .py files in seeded order, one random chunk of each (big files stay cheap)."""
    files = []
    for root, dirs, names in os.walk(sysconfig.get_paths()["stdlib"]):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__"))
        files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
    rng.shuffle(files)
    for f in files:
        chunks = _chunks(Path(f).read_text(encoding="utf-8", errors="replace"))
        if chunks:
            yield rng.choice(chunks)


@_cached_chunks
def _fortune_docs(folder: Path) -> list[str]:
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.suffix and p.name[0] != ".")
    return [f.strip() for p in files for f in p.read_text(errors="replace").split("\n%\n")]


def _fortunes(rng):
    return _shuffled(rng, _fortune_docs, _system_dir(FORTUNES_DIR, "fortunes"))


@_cached_chunks
def _wordnet_docs(folder: Path) -> list[str]:
    """The glosses of each data.* file, one per line (a line ends with '| definition; "example"')."""
    return ["\n".join(line.split(" | ", 1)[1].strip() for line in p.read_text(errors="replace").splitlines()
                      if " | " in line and not line.startswith(" ")) for p in sorted(folder.glob("data.*"))]


def _wordnet(rng):
    return _shuffled(rng, _wordnet_docs, _system_dir(WORDNET_DIR, "wordnet-base"))


def _user_file(path: str):
    """A loader for a user file: .txt (one prompt per line) or .jsonl (a "text" field per line);
    rng=None keeps the file's order."""
    p = Path(path)
    if not p.is_file():
        raise CorpusError(f"prompt file not found: {path}")

    def load(rng):
        lines = [s for s in p.read_text(encoding="utf-8").splitlines() if s.strip()]
        docs = [json.loads(s)["text"] for s in lines] if p.suffix == ".jsonl" else lines
        if rng is not None:
            rng.shuffle(docs)
        return iter(docs)
    return load


def _whole_file(path: str, tokenizer, length: int | None, seen) -> list[tuple[int, ...]]:
    """Every line of a user file, in order: whole (length None) or cut into every non-overlapping
    span of `length` ids; repeated sequences once."""
    out = {}
    for ids in tokenizer(list(_user_file(path)(None)), add_special_tokens=False)["input_ids"]:
        spans = [ids] if length is None else [ids[i:i + length] for i in range(0, len(ids) - length + 1, length)]
        out.update(dict.fromkeys(t for s in spans if (t := tuple(s)) and t not in seen))
    if not out:
        raise CorpusError(f"{path} gives no prompt" + (f" of {length} tokens" if length else ""))
    return list(out)


CORPORA = {
    "prose": ("English prose: Wikipedia articles and news stories (gensim test data)", _prose),
    "code": ("Python source code from this interpreter's standard library", _code),
    "chat": ("Human chit-chat messages, one per line (PyPI chitchat-dataset)", _chat),
    "tech": ("Technical prose: the Python reference manual (pydoc_data.topics)", _tech),
    "random": ("Uniform random token ids, no special or added tokens", None),
    "fortunes": ("Quotes, jokes and dialogue from the Debian 'fortunes' package", _fortunes),
    "wordnet": ("Dictionary definitions from the Debian 'wordnet-base' package", _wordnet),
}


def available() -> dict[str, bool]:
    """For each named corpus, whether its data is on this machine."""
    def ok(loader):
        try:
            return loader is None or loader(random.Random(0)) is not None
        except Unavailable:
            return False
    return {name: ok(loader) for name, (_, loader) in CORPORA.items()}


# ---------------------------------------------------------------- sampling

def _batches(docs, chars: int = 100_000):
    """Group documents into lists of about `chars` characters (one tokenizer call each)."""
    batch, n = [], 0
    for d in docs:
        batch.append(d)
        n += len(d)
        if n >= chars:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


def _text_spans(name, docs, tokenizer, length, n, rng, seen) -> list[tuple[int, ...]]:
    """n distinct spans of `length` ids from the documents, non-overlapping when enough text."""
    pool, encoded = {}, []
    for batch in _batches(docs, min(100_000, 4 * POOL * n * length)):
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            encoded.append(ids)
            room = len(ids) - length + 1  # number of span starts in this document
            for i in range(rng.randrange(min(length, room)) if room > 0 else 0, room, length):
                if (span := tuple(ids[i:i + length])) not in seen:
                    pool[span] = None
        if len(pool) >= POOL * n:
            break
    if len(pool) < n:  # not enough text: allow overlapping spans from everything read
        pool.update(dict.fromkeys(s for ids in encoded for i in range(len(ids) - length + 1)
                                  if (s := tuple(ids[i:i + length])) not in seen))
    if len(pool) < n:
        raise CorpusError(f"corpus {name!r} can provide only {len(pool)} distinct spans of "
                         f"{length} tokens, {n} requested")
    return rng.sample(list(pool), n)


def _random_spans(tokenizer, length, n, rng, seen, vocab_size: int | None = None) -> list[tuple[int, ...]]:
    """Uniform random ids, no special or added tokens (a model without tokenizer: every id < vocab_size)."""
    if tokenizer is None:
        if vocab_size is None:
            raise CorpusError("random ids for a model without a tokenizer need its vocabulary size (vocab_size)")
        vocab = list(range(vocab_size))
    else:
        special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        vocab = sorted(set(tokenizer.get_vocab().values()) - special)
    if n > len(vocab) ** length - len(seen):
        raise CorpusError(f"corpus 'random' can provide only {len(vocab) ** length - len(seen)} "
                         f"distinct spans of {length} tokens, {n} requested")
    out = {}
    while len(out) < n:
        if (span := tuple(rng.choices(vocab, k=length))) not in seen:
            out[span] = None
    return list(out)


def parse_spec(spec: str) -> list[tuple[str, int | None]]:
    """'prose:2000,code:10,my.txt' -> [('prose', 2000), ('code', 10), ('my.txt', None)] (None: every line)."""
    parts = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, count = part.rpartition(":")
        if not sep and part.endswith((".txt", ".jsonl")):
            parts.append((part, None))
        elif not sep or not count.strip().isdigit():
            raise CorpusError(f"bad corpus spec {part!r}: expected {SPEC_HELP}")
        else:
            parts.append((name.strip(), int(count)))
    return parts


def default_length(spec: str) -> int | None:
    """The prompt length when none is asked for: None (lines as given) if the spec has a file
    without a count, else DEFAULT_LENGTH."""
    return None if any(n is None for _, n in parse_spec(spec)) else DEFAULT_LENGTH


def sample(spec: str, tokenizer, length: int | None, seed: int = 0, vocab_size: int | None = None) -> list[Prompt]:
    """Prompts of exactly `length` token ids for a spec like 'prose:2000,code:2000,random:1000'.
    length None: files without a count give their lines as they are, other parts DEFAULT_LENGTH.
    tokenizer None (a model given by ids only, e.g. random:<arch>): only random:N, over every id
    below vocab_size, with empty texts.

    Reproducible under `seed` (for a given tokenizer and installed data); each part draws from its
    own generator seeded by (seed, name), so adding a part leaves the others unchanged apart from
    dedup: no two returned prompts have the same ids.
    """
    if length is not None and length < 1:
        raise CorpusError(f"prompt length must be at least 1 token, got {length}")
    prompts, seen = [], set()
    for name, n in parse_spec(spec):
        rng = random.Random(f"{seed}:{name}")
        if tokenizer is None and (name != "random" or n is None):
            raise CorpusError(f"corpus {name!r} is text, and this model has no tokenizer (ids only): use random:N "
                              "or give token ids (sipit capture --ids FILE)")
        if n is None:
            spans = _whole_file(name, tokenizer, length, seen)
        elif name == "random":
            spans = _random_spans(tokenizer, length or DEFAULT_LENGTH, n, rng, seen, vocab_size)
        else:
            if name in CORPORA:
                loader = CORPORA[name][1]
            elif name.endswith((".txt", ".jsonl")):
                loader = _user_file(name)
            else:
                raise CorpusError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)} "
                                 f"(or your own file: {SPEC_HELP})")
            try:
                docs = iter(loader(rng))
            except Unavailable as e:
                raise Unavailable(f"corpus {name!r} {e}") from None
            spans = _text_spans(name, docs, tokenizer, length or DEFAULT_LENGTH, n, rng, seen)
        seen.update(spans)
        texts = [""] * len(spans) if tokenizer is None else \
            tokenizer.batch_decode([list(s) for s in spans], clean_up_tokenization_spaces=False)
        prompts += [Prompt(list(s), t, name) for s, t in zip(spans, texts)]
    return prompts
