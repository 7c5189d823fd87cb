"""sipit.corpora: exact-length, reproducible, distinct prompt spans from named sources and files."""

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from sipit import corpora
from sipit.corpora import CORPORA, CorpusError, Prompt, Unavailable, available, sample

DEFAULTS = ["prose", "code", "chat", "tech", "random"]  # must work on a clean `make test` machine


@pytest.fixture(scope="module")
def tok():
    """Byte-level BPE with only the 256-byte alphabet, plus one special and one added token."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    t = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|endoftext|>")
    t.add_tokens(["<extra>"])
    return t


def ids_set(prompts):
    return {tuple(p.ids) for p in prompts}


def test_default_corpora_available_and_exact_length(tok):
    assert all(available()[name] for name in DEFAULTS), available()
    prompts = sample(",".join(f"{name}:30" for name in DEFAULTS), tok, 24)
    assert [p.source for p in prompts] == [name for name in DEFAULTS for _ in range(30)]
    for p in prompts:
        assert isinstance(p, Prompt) and len(p.ids) == 24
        if p.source != "random" and "\ufffd" not in p.text:  # a span may cut a UTF-8 character
            assert p.ids == tok(p.text, add_special_tokens=False)["input_ids"]
    assert len(ids_set(prompts)) == len(prompts)


def test_deterministic_under_seed_and_seeds_differ(tok):
    spec = "tech:40,code:40,random:40"
    a, b, c = sample(spec, tok, 12, seed=3), sample(spec, tok, 12, seed=3), sample(spec, tok, 12, seed=4)
    assert [p.ids for p in a] == [p.ids for p in b]
    for name in ("tech", "code", "random"):
        assert ids_set(q for q in a if q.source == name) != ids_set(q for q in c if q.source == name)


def test_dedup_within_and_across_parts(tmp_path, tok):
    f = tmp_path / "rep.txt"
    f.write_text("the same line again\n" * 200 + "another line here\n")
    prompts = sample(f"{f}:3", tok, 17)  # only 3 distinct 17-byte spans exist in "the same line again"
    assert len(ids_set(prompts)) == 3
    twice = sample("tech:50,tech:50", tok, 10)
    assert len(ids_set(twice)) == 100


def test_user_txt_and_jsonl(tmp_path, tok):
    lines = [f"prompt number {i} says hello to the world" for i in range(40)]
    txt, jsonl = tmp_path / "p.txt", tmp_path / "p.jsonl"
    txt.write_text("\n".join(lines) + "\n\n")
    jsonl.write_text("".join(json.dumps({"text": s, "id": i}) + "\n" for i, s in enumerate(lines)))
    for path in (txt, jsonl):
        prompts = sample(f"{path}:30", tok, 20, seed=1)
        assert len(prompts) == 30 and all(len(p.ids) == 20 for p in prompts)
        assert all(p.source == str(path) and any(p.text in s for s in lines) for p in prompts)


def test_random_excludes_special_and_added_ids(tok):
    banned = set(tok.all_special_ids) | set(tok.added_tokens_decoder)
    assert len(banned) == 2
    prompts = sample("random:3000", tok, 8)
    used = {i for p in prompts for i in p.ids}
    assert not used & banned and used <= set(range(256)) and len(used) == 256
    assert all(p.text == tok.decode(p.ids) for p in prompts[:10])


def test_too_few_spans_is_a_clear_error(tmp_path, tok):
    f = tmp_path / "short.txt"
    f.write_text("x" * 5 + "abcdefghijklmnopqrstuvwxyz0123\n")  # 35 bytes: 26 distinct 10-byte spans
    assert len(sample(f"{f}:26", tok, 10)) == 26
    with pytest.raises(ValueError, match=r"short.txt' can provide only 26 distinct spans of 10 tokens, 27"):
        sample(f"{f}:27", tok, 10)
    with pytest.raises(ValueError, match="can provide only 256 distinct spans"):
        sample("random:257", tok, 1)


def test_unknown_name_and_bad_spec(tok):
    with pytest.raises(ValueError, match="unknown corpus 'poetry'; known: " + ", ".join(CORPORA)):
        sample("prose:5,poetry:5", tok, 8)
    with pytest.raises(ValueError, match=r"expected NAME:N .*FILE.txt:N .*FILE.txt / FILE.jsonl \(every line"):
        sample("prose", tok, 8)
    with pytest.raises(CorpusError, match="not found"):
        sample("missing/file.txt:5", tok, 8)
    with pytest.raises(ValueError, match="at least 1 token"):
        sample("tech:5", tok, 0)


def test_optional_debian_corpus_names_its_package(monkeypatch, tmp_path, tok):
    monkeypatch.setattr(corpora, "FORTUNES_DIR", str(tmp_path / "nowhere"))
    assert available()["fortunes"] is False
    with pytest.raises(Unavailable, match="corpus 'fortunes' needs the Debian package 'fortunes'"):
        sample("fortunes:5", tok, 8)


def test_file_without_count_is_every_line_as_given(tmp_path, tok):
    f = tmp_path / "prompts.txt"
    lines = ["short", "a somewhat longer line of text", "", "short", "mid length"]
    f.write_text("\n".join(lines) + "\n")
    prompts = sample(str(f), tok, None)  # every distinct non-empty line, in file order, its own length
    assert [p.text for p in prompts] == ["short", "a somewhat longer line of text", "mid length"]
    assert [len(p.ids) for p in prompts] == [5, 30, 10] and {p.source for p in prompts} == {str(f)}
    spans = sample(str(f), tok, 5)  # --length asks for every non-overlapping span of 5 tokens
    assert [p.text for p in spans] == ["short", "a som", "ewhat", " long", "er li", "ne of", " text", "mid l", "ength"]
    assert len(sample(f"{f}:3", tok, 5)) == 3  # FILE:N still samples N spans
    assert corpora.default_length(f"prose:5,{f}") is None and corpora.default_length("prose:5") == 20
    with pytest.raises(CorpusError, match="no prompt of 40 tokens"):
        sample(str(f), tok, 40)


def test_a_model_without_tokenizer_samples_random_ids_only():
    prompts = sample("random:5", None, 4, vocab_size=100)
    assert len(prompts) == 5 and all(len(p.ids) == 4 and max(p.ids) < 100 and p.text == "" for p in prompts)
    assert len({tuple(p.ids) for p in prompts}) == 5
    with pytest.raises(CorpusError, match="no tokenizer"):
        sample("prose:2", None, 4, vocab_size=100)
