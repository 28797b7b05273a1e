#!/usr/bin/env python3
"""Writes the seed corpora tests/fuzz/corpus/<target>/ (standard library only).

    python3 tests/fuzz/make_seeds.py [OUTDIR]      default: tests/fuzz/corpus

Seeds are small hand-made inputs: valid ones that reach deep (a checkpoint
that loads, a session that loads a model and opens a ring, requests that run
on every layer) and one per error path worth starting from. The found-*
files next to them came out of fuzzing runs (each one added edge coverage;
see docs/fuzzing.md); rerunning this script rewrites only the files it
names, never those.
The tiny checkpoint mirrors tests/fuzz/fuzz_common.h: keep them in step.
"""
import json
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) < 64 * 1024, (target, name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors ----------------------------------------------------------

def st_raw(header: bytes, data: bytes = b"", pad=True, len_field=None):
    if pad:
        header += b" " * (-len(header) % 8)
    n = len(header) if len_field is None else len_field
    return struct.pack("<Q", n) + header + data


def st(tensors, meta=None):
    """tensors: list of (name, dtype, shape, bytes)."""
    h, off, blob = {}, 0, b""
    if meta is not None:
        h["__metadata__"] = meta
    for name, dtype, shape, data in tensors:
        h[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        blob += data
    return st_raw(json.dumps(h, separators=(",", ":")).encode(), blob)


def fill(pattern: int, width: int, nbytes: int):
    return (pattern.to_bytes(width, "little") * (nbytes // width + 1))[:nbytes]


QZ = 0x77777777
SHARD1 = [
    ("model.layers.0.self_attn.q_proj.qweight", "I32", [16, 16], fill(0x89ABCDEF, 4, 1024)),
    ("model.layers.0.self_attn.q_proj.scales", "F16", [1, 16], fill(0x3C00, 2, 32)),
    ("model.layers.0.self_attn.q_proj.qzeros", "I32", [1, 2], fill(QZ, 4, 8)),
    ("model.layers.0.self_attn.q_proj.g_idx", "I32", [128], fill(0, 4, 512)),
    ("model.layers.0.self_attn.q_proj.bias", "F32", [16], fill(0x3F000000, 4, 64)),
]
SHARD2 = [
    ("model.layers.0.mlp.down_proj.qweight", "I32", [32, 8], fill(0x01234567, 4, 1024)),
    ("model.layers.0.mlp.down_proj.scales", "F16", [2, 8], fill(0x3C00, 2, 32)),
    ("model.layers.0.mlp.down_proj.qzeros", "I32", [2, 1], fill(QZ, 4, 8)),
    ("model.layers.1.self_attn.o_proj.weight", "BF16", [8, 16], fill(0x3F80, 2, 256)),
    ("lm_head.weight", "F16", [8, 16], fill(0x3C00, 2, 256)),
    ("model.embed_tokens.weight", "BF16", [4, 16], fill(0x3F80, 2, 128)),
    ("model.norm.weight", "F32", [16], fill(0x3F800000, 4, 64)),
]
SHARD1_NAME = "model-00001-of-00002.safetensors"
SHARD2_NAME = "model-00002-of-00002.safetensors"


def replace(tensors, name, **kw):
    out = []
    for t in tensors:
        if t[0] == name:
            n, d, s, b = t
            t = (kw.get("name", n), kw.get("dtype", d), kw.get("shape", s), kw.get("data", b))
        out.append(t)
    return out


def safetensors_seeds():
    T = "fuzz_safetensors"
    full = SHARD1 + SHARD2
    write(T, "valid_tiny_model", st(full, {"format": "pt"}))
    write(T, "valid_shard1", st(SHARD1))
    write(T, "valid_empty_object", st_raw(b"{}"))
    write(T, "valid_scalar_and_empty", st([("s", "F32", [], b"\0\0\x80\x3f"), ("e", "BF16", [0, 4], b"")]))
    write(T, "valid_every_dtype", st([
        ("bool", "BOOL", [1], b"\1"), ("u8", "U8", [1], b"\2"), ("i8", "I8", [1], b"\3"),
        ("e5m2", "F8_E5M2", [1], b"\4"), ("e4m3", "F8_E4M3", [1], b"\5"), ("e8m0", "F8_E8M0", [1], b"\6"),
        ("i16", "I16", [1], b"\0\1"), ("u16", "U16", [1], b"\0\2"), ("f16", "F16", [1], b"\0\x3c"),
        ("bf16", "BF16", [1], b"\x80\x3f"), ("i32", "I32", [1], b"\0" * 4), ("u32", "U32", [1], b"\1" * 4),
        ("f32", "F32", [1], b"\0" * 4), ("f64", "F64", [1], b"\0" * 8), ("i64", "I64", [1], b"\0" * 8),
        ("u64", "U64", [1], b"\0" * 8), ("c64", "C64", [1], b"\0" * 8), ("f4", "F4", [2], b"\x21"),
        ("f6a", "F6_E2M3", [4], b"\0\0\0"), ("f6b", "F6_E3M2", [4], b"\0\0\0"),
    ], {"k": "v", "note": "every dtype"}))
    write(T, "bad_too_short", b"\x02\0\0\0")
    write(T, "bad_header_too_large", struct.pack("<Q", 100000001) + b"{}")
    write(T, "bad_header_past_end", st_raw(b"{}", pad=False, len_field=64))
    write(T, "bad_not_json", st_raw(b"{\"a\":"))
    write(T, "bad_array_header", st_raw(b"[1,2]"))
    write(T, "bad_leading_space", st_raw(b" {}", pad=False))
    write(T, "bad_duplicate_key", st_raw(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                        b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"))
    write(T, "bad_dtype", st([("t", "F128", [1], b"\0" * 16)]))
    write(T, "bad_negative_dim", st_raw(b'{"t":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', b"\0"))
    write(T, "bad_overlap", st_raw(b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
                                  b'"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', b"\0" * 3))
    write(T, "bad_hole", st_raw(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\0" * 2))
    write(T, "bad_trailing", st([("a", "U8", [1], b"\0")]) + b"\0")
    write(T, "bad_reversed", st_raw(b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[1,0]}}', b"\0"))
    write(T, "bad_overflow", st_raw(b'{"a":{"dtype":"F64","shape":[4294967296,4294967296,16],'
                                   b'"data_offsets":[0,0]}}'))
    write(T, "bad_f4_odd", st([("a", "F4", [3], b"\0\0")]))
    write(T, "bad_metadata_value", st([("a", "U8", [1], b"\0")], {"k": 1}))
    # a clone without git-lfs: the pointer text in place of the file
    write(T, "bad_lfs_pointer", b"version https://git-lfs.github.com/spec/v1\n"
          b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 29727712\n")
    # loader paths: valid files the loader refuses
    write(T, "loader_qzeros_asym", st(replace(full, "model.layers.0.self_attn.q_proj.qzeros",
                                              data=fill(0x88888888, 4, 8))))
    write(T, "loader_act_order", st(replace(full, "model.layers.0.self_attn.q_proj.g_idx",
                                            data=b"".join(struct.pack("<i", 127 - k) for k in range(128)))))
    write(T, "loader_scale_inf", st(replace(full, "model.layers.0.mlp.down_proj.scales",
                                            data=fill(0x7C00, 2, 32))))
    write(T, "loader_k_not_128", st(replace(replace(full, "model.layers.0.self_attn.q_proj.qweight",
                                                    shape=[8, 32]),
                                            "model.layers.0.self_attn.q_proj.g_idx", shape=[128])))
    write(T, "loader_bias_shape", st(replace(full, "model.layers.0.self_attn.q_proj.bias",
                                             shape=[4, 4])))
    write(T, "loader_weight_in_block", st(full + [("model.layers.2.mlp.up_proj.weight", "BF16",
                                                   [2, 4], b"\0" * 16)]))
    write(T, "loader_no_linear", st([("model.embed_tokens.weight", "BF16", [2, 2], b"\0" * 8)]))
    write(T, "loader_f32_bf16_linear", st(SHARD1 + [("head.weight", "F32", [2, 4], fill(0x3F800000, 4, 32)),
                                                    ("head.bias", "BF16", [2], b"\0" * 4)]))
    write(T, "loader_ndim9", st(full + [("x", "U8", [1] * 9, b"\0")]))


# ---- protobuf (hand-rolled encoder for the seeds) --------------------------

def varint(v):
    out = b""
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def fv(field, v):            # varint field
    return varint(field << 3) + varint(v)


def fb(field, b):            # length-delimited field
    if isinstance(b, str):
        b = b.encode()
    return varint(field << 3 | 2) + varint(len(b)) + b


def frame(body):
    return struct.pack("<I", len(body)) + body


def cmsg(tag, field, body=b""):
    """ClientMessage / ServerMessage: tag then one oneof member."""
    return frame((fv(1, tag) if tag else b"") + fb(field, body))


def hello(tag=1, version=1, name="fuzz-seed"):
    return cmsg(tag, 2, fv(1, version) + fb(2, name))


def load(tag, names, name=None):
    body = (fb(1, name) if name else b"") + b"".join(fb(2, n) for n in names)
    return cmsg(tag, 3, body)


def attach(tag, name):
    return cmsg(tag, 4, fb(1, name))


def release(tag, mid):
    return cmsg(tag, 5, fv(1, mid))


def get_model(tag, mid):
    return cmsg(tag, 6, fv(1, mid))


def list_models(tag):
    return cmsg(tag, 7)


def open_ring(tag, sq=0, cq=0, arena=0):
    body = (fv(1, sq) if sq else b"") + (fv(2, cq) if cq else b"") + (fv(3, arena) if arena else b"")
    return cmsg(tag, 8, body)


def get_stats(tag):
    return cmsg(tag, 9)


def list_tensors(tag, mid):
    return cmsg(tag, 30, fv(1, mid))


def map_tensors(tag, mid):
    return cmsg(tag, 31, fv(1, mid))


SINGLE = ["config.json", "model.safetensors"]
SHARDED = ["config.json", "model.safetensors.index.json", SHARD1_NAME, SHARD2_NAME]


def frame_seeds():
    T = "fuzz_frame"
    write(T, "client_hello", hello())
    write(T, "client_session", hello() + load(2, SINGLE, "tiny") + get_model(3, 1) + list_models(4) +
          attach(5, "tiny") + release(6, 1) + open_ring(7, 8, 16, 65536) + get_stats(8))
    write(T, "client_load_sharded", load(9, SHARDED + ["quantization_config.json"]))
    write(T, "client_empty_oneof", frame(fv(1, 5)))
    write(T, "client_unknown_field", frame(fv(1, 1) + fb(15, b"xyz") + fb(2, fv(1, 1))))
    sm = lambda tag, field, body=b"": cmsg(tag, field, body)
    layer = fv(1, 0) + fb(2, "model.layers.0.q") + fv(3, 1) + fv(4, 16) + fv(5, 128) + fv(6, 1) + fv(7, 1088)
    tensor = fb(1, "model.norm.weight") + fb(2, "F32") + fb(3, varint(16))
    info = fv(1, 1) + fb(2, "tiny") + fv(3, 4096) + fv(5, 1) + fb(6, layer) + fb(7, tensor)
    write(T, "server_replies", sm(1, 2, fv(1, 1) + fb(2, "0.1.0") + fb(3, "cpu") + fb(4, "x86") +
                                   fv(5, 1) + fv(6, 512)) +
          sm(2, 5, fv(1, 10) + fv(2, 100)) + sm(2, 4, info) + sm(3, 6, fb(1, info)) +
          sm(4, 7, fv(1, 1 << 20)) + sm(5, 8, fb(1, fv(1, 3) + fv(9, 1)) + fb(2, fv(1, 1)) +
                                         fb(3, fv(1, 1) + fb(2, "c") + fv(3, 42) + fv(4, 0))) +
          sm(6, 9) + sm(7, 3, fv(1, 22) + fb(2, "bad request")))
    write(T, "zero_length", struct.pack("<I", 0))
    write(T, "over_max_frame", struct.pack("<I", (1 << 20) + 1) + b"\0" * 8)
    write(T, "max_frame_partial", struct.pack("<I", 1 << 20) + b"\x08\x01")
    write(T, "truncated_prefix", b"\x05\x00")
    write(T, "garbage_body", frame(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"))
    write(T, "packed_repeated", cmsg(1, 4, fv(1, 1) + fb(3, varint(1) + varint(2) + varint(300))))


def session_seeds():
    T = "fuzz_session"
    write(T, "hello_only", hello())
    write(T, "hello_list_stats", hello() + list_models(2) + get_stats(3))
    write(T, "load_use_release", hello() + load(2, SINGLE) + get_model(3, 1) + list_models(4) +
          attach(5, "tiny-w4g128") + get_stats(6) + release(7, 1) + get_model(8, 1))
    write(T, "load_sharded_qconfig", hello() + load(2, SHARDED + ["quantization_config.json"], "sharded") +
          get_model(3, 1))
    write(T, "load_tensors", hello() + list_tensors(2, 1) + map_tensors(3, 1) + load(4, SINGLE) +
          list_tensors(5, 1) + map_tensors(6, 1) + map_tensors(7, 1) + list_tensors(8, 2) +
          map_tensors(9, 2) + release(10, 1) + map_tensors(11, 1) + list_tensors(12, 1))
    write(T, "load_twice_same_files", hello() + load(2, SINGLE, "a") + load(3, SINGLE) + load(4, SINGLE, "b"))
    write(T, "load_bad_names", hello() + load(2, ["../config.json", "model.safetensors"]) +
          load(3, ["config.json", "config.json"]) + load(4, ["", "x"]))
    write(T, "load_missing_weights", hello() + load(2, ["config.json", "tokenizer.json"]))
    write(T, "load_extra_fd", hello() + load((1 << 62) | 2, SINGLE))
    write(T, "open_ring", hello() + open_ring(2, 8, 16, 65536) + get_stats(3) + open_ring(4))
    write(T, "open_ring_defaults_then_load", hello() + open_ring(2) + load(3, SINGLE) + release(4, 1))
    write(T, "open_ring_bad", hello() + open_ring(2, 3) + open_ring(3, 8, 4) + open_ring(4, 0, 0, 1 << 40) +
          open_ring(5, 128))
    write(T, "no_hello", list_models(1))
    write(T, "second_hello", hello() + hello(2))
    write(T, "wrong_version", hello(1, 7))
    write(T, "release_unknown", hello() + release(2, 99) + get_model(3, 0) + attach(4, "nope"))
    write(T, "empty_oneof", hello() + frame(fv(1, 2)))
    write(T, "undecodable", hello() + frame(b"\xff\xff"))
    write(T, "zero_length_frame", hello() + struct.pack("<I", 0))
    write(T, "partial_frame_eof", hello() + struct.pack("<I", 100) + b"\x08")


# ---- ring slots ------------------------------------------------------------

def req(rid, model, layer, rows, dtype, inp, out):
    body = fv(1, rid) + fv(2, model) + fv(3, layer) + fv(4, rows) + fv(5, dtype) + fv(6, inp) + fv(7, out)
    return body


def slot(payload, length=None):
    if length is None:
        return bytes([len(payload)]) + payload
    return bytes([255]) + struct.pack("<I", length) + payload[:252]


def rnd(slots, ring=0, no_pass=False, wild_tail=None, cq_back=None, count=None):
    n = len(slots) if count is None else count
    h = (n & 0x0F) | (0x10 if no_pass else 0) | (0x20 if wild_tail is not None else 0) | \
        (0x40 if cq_back is not None else 0) | (0x80 if ring else 0)
    out = bytes([h]) + b"".join(slots)
    if wild_tail is not None:
        out += struct.pack("<I", wild_tail)
    if cq_back is not None:
        out += bytes([cq_back])
    return out


def geometry(sq_log2=2, cq_double=False, small_inflight=False, arena_sel=7, seed=1):
    g = sq_log2 | (4 if cq_double else 0) | (8 if small_inflight else 0)
    return bytes([g, arena_sel, seed])   # arena = 256 * (arena_sel % 32 + 1)


def ring_seeds():
    T = "fuzz_ring_slot"
    G = geometry()                 # sq 4, cq 4, arena 2048
    # model 1: layer 0 W4A8 16x128 (x 256 B/row, y 32 B/row), layer 1 bf16 8x16,
    # layer 2 W4A8 8x256, layer 3 W4A8 24x128, layer 4 bf16 8x128; model 2:
    # layer 0 bf16 24x8
    ok = [
        req(1, 1, 0, 1, 1, 0, 1024),
        req(2, 1, 1, 2, 2, 256, 1280),
        req(3, 1, 2, 1, 1, 512, 1536),
        req(4, 2, 0, 4, 1, 1792, 1600),
    ]
    write(T, "valid_every_layer", G + rnd([slot(p) for p in ok]))
    write(T, "valid_merge_two_rings", G + rnd([slot(req(1, 1, 0, 2, 1, 0, 1024))], 0, no_pass=True) +
          rnd([slot(req(2, 1, 0, 3, 2, 0, 1024))], 1))
    write(T, "valid_max_rows", geometry(3, True, False, 31, 7) +
          rnd([slot(req(9, 1, 0, 8, 1, 0, 4096)), slot(req(10, 1, 0, 8, 2, 2048, 4352))]))
    write(T, "valid_many_rounds", G + b"".join(rnd([slot(req(i, 1, 1, 1, 1, 64 * i, 1024 + 32 * i))])
                                                for i in range(8)))
    write(T, "valid_nan_inputs", geometry(2, False, False, 7, 0xFF) + rnd([slot(ok[0]), slot(ok[1])]))
    write(T, "valid_empty_request", G + rnd([slot(b"\x08\x00")]))
    rejects = [
        req(1, 3, 0, 1, 1, 0, 1024),     # model not referenced: ENOENT
        req(2, 1, 5, 1, 1, 0, 1024),     # layer out of range: ENOENT
        req(3, 1, 0, 0, 1, 0, 1024),     # rows 0: EINVAL
        req(4, 1, 0, 9, 1, 0, 1024),     # rows > max_rows: EINVAL
    ]
    write(T, "reject_enoent_rows", G + rnd([slot(p) for p in rejects]))
    rejects = [
        req(5, 1, 0, 1, 0, 0, 1024),     # dtype unspecified
        req(6, 1, 0, 1, 1, 8, 1024),     # input misaligned
        req(7, 1, 0, 1, 1, 2000, 1024),  # input past the arena: EFAULT
        req(8, 1, 0, 1, 1, 0, 128),      # overlap
    ]
    write(T, "reject_dtype_align_fault_overlap", G + rnd([slot(p) for p in rejects]))
    write(T, "reject_huge_offsets", G + rnd([slot(req(1, 1, 0, 8, 1, (1 << 64) - 16, 0)),
                                             slot(req(2, 1, 2, 4294967295, 1, 0, 1 << 63))]))
    write(T, "reject_busy", geometry(3, False, True) + rnd([slot(ok[0]), slot(ok[1]), slot(ok[2])]))
    write(T, "violation_len_zero", G + rnd([slot(b"", 0)]))
    write(T, "violation_len_253", G + rnd([bytes([253]) + b"\0" * 252]))
    write(T, "violation_len_huge", G + rnd([slot(ok[0], 0xFFFFFFFF)]))
    write(T, "violation_not_a_request", G + rnd([slot(b"\xff\xff\xff")]))
    write(T, "violation_tail_wild", G + rnd([slot(ok[0])], wild_tail=0x80000000))
    write(T, "violation_tail_ahead", G + rnd([slot(ok[0])], count=9))
    write(T, "violation_cq_head", G + rnd([slot(ok[0])], cq_back=200) + rnd([slot(ok[1])]))
    # model 1 layer 3: W4A8 24x128, layer 4 bf16 8x128 (K 128, as layer 0)
    write(T, "valid_multi_layer", G + rnd([slot(multi(1, 1, [0, 3], 2, 1, 0, [1024, 1152])),
                                           slot(multi(2, 1, [3, 0, 4], 1, 2, 256, [1408, 1536, 1600]))]))
    write(T, "valid_multi_merge_two_rings", G +
          rnd([slot(multi(1, 1, [0, 4], 2, 1, 0, [1024, 1152]))], 0, no_pass=True) +
          rnd([slot(multi(2, 1, [0, 4], 3, 1, 0, [1024, 1152]))], 1))
    write(T, "valid_multi_pieces", geometry(3, True, False, 31, 5) +
          rnd([slot(multi(3, 1, [0, 3, 4], 8, 1, 0, [4096, 5120, 6144]))]))
    write(T, "reject_multi_k", G + rnd([slot(multi(1, 1, [0, 2], 1, 1, 0, [1024, 1152]))]))
    write(T, "cq_full_backpressure", geometry(3, False, False, 31, 3) +
          rnd([slot(req(i, 1, 1, 1, 1, 32 * i, 4096 + 16 * i)) for i in range(8)], cq_back=0) +
          rnd([], cq_back=8) + rnd([]))


def packed(field, values):     # a packed repeated varint field
    return fb(field, b"".join(varint(v) for v in values))


def multi(rid, model, layers, rows, dtype, inp, outs):
    """A LinearRequest of several layers: layers[0]/outs[0] in layer and
    output_offset, the rest in extra_layers (20) and extra_output_offsets (21)."""
    return req(rid, model, layers[0], rows, dtype, inp, outs[0]) + \
        packed(20, layers[1:]) + packed(21, outs[1:])


def request_seeds():
    T = "fuzz_request"
    A = bytes([63, 7])          # arena 16384, max_rows 8
    # model 1: 0 W4A8 16x128, 1 W4A8 32x128, 2 bf16 8x128, 3 W4A8 8x256, 4 bf16 8x16
    write(T, "valid_one", A + req(1, 1, 0, 2, 1, 0, 1024))
    write(T, "valid_three", A + multi(2, 1, [0, 1, 2], 2, 1, 0, [1024, 2048, 4096]))
    write(T, "valid_eight_rows", A + multi(3, 1, [1, 0], 8, 2, 0, [4096, 8192]))
    write(T, "reject_k", A + multi(4, 1, [0, 3], 1, 1, 0, [1024, 2048]))
    write(T, "reject_repeat", A + multi(5, 1, [0, 1, 0], 1, 1, 0, [1024, 2048, 3072]))
    write(T, "reject_too_many", A + multi(6, 1, [0, 1, 2, 0, 1, 2, 0, 1, 2], 1, 1, 0,
                                          [1024 * (i + 1) for i in range(9)]))
    write(T, "reject_counts", A + req(7, 1, 0, 1, 1, 0, 1024) + packed(20, [1]))
    write(T, "reject_out_overlap", A + multi(8, 1, [0, 1], 1, 1, 0, [1024, 1040]))
    write(T, "reject_out_fault", A + multi(9, 1, [0, 1], 1, 1, 0, [1024, 16384 - 32]))
    write(T, "reject_range", A + multi(10, 1, [0, 7], 1, 1, 0, [1024, 2048]))
    write(T, "reject_model", A + multi(11, 2, [0, 1], 1, 1, 0, [1024, 2048]))


# ---- quantization config ---------------------------------------------------

QC = {
    "quant_method": "auto-round", "packing_format": "auto_round:auto_gptq", "bits": 4,
    "group_size": 128, "sym": True, "data_type": "int", "block_name_to_quantize": "model.layers",
    "extra_config": {
        "model.layers.1.self_attn.o_proj": {"bits": 16, "data_type": "fp"},
        r"model\.layers\.[0-9]+\.mlp\.down_proj": {"bits": 4, "group_size": 128, "sym": True},
    },
}


def config(qc):
    return {"_name_or_path": "org/tiny-w4g128", "architectures": ["TinyForCausalLM"],
            "torch_dtype": "bfloat16", "quantization_config": qc}


def qc_with(**kw):
    q = json.loads(json.dumps(QC))
    for k, v in kw.items():
        if v is None:
            q.pop(k, None)
        else:
            q[k] = v
    return q


def quant_config_seeds():
    T = "fuzz_quant_config"
    j = lambda o: json.dumps(o, indent=1)
    write(T, "valid_config", j(config(QC)))
    write(T, "valid_quantization_config", j(QC))
    index = {"metadata": {"total_size": 0},
             "weight_map": {t[0]: SHARD1_NAME for t in SHARD1} | {t[0]: SHARD2_NAME for t in SHARD2}}
    write(T, "valid_index", j(index))
    write(T, "valid_aliases", j(config(qc_with(quant_method="Intel/Auto_Round", packing_format="auto_round:gptq",
                                               bits=4.0, group_size=128.0, data_type=None))))
    write(T, "routing_blocks_nested", j(config(qc_with(block_name_to_quantize=None,
                                                     to_quant_block_names=[["model.layers", " lm_head. "],
                                                                           "model.vision,model.x"]))))
    write(T, "valid_blocks_null", j(config(qc_with(block_name_to_quantize=None,
                                                   extra_config={"model.layers.1.self_attn.o_proj":
                                                                 {"bits": 16}}))))
    write(T, "bad_regex", j(config(qc_with(extra_config={"model.layers.([0-9": {"bits": 16}}))))
    write(T, "bad_override_bits", j(config(qc_with(extra_config={"lm_head": {"bits": 8}}))))
    write(T, "bad_override_types", j(config(qc_with(extra_config={"a": {"bits": "4"}, "b": []}))))
    write(T, "bad_sym_false", j(config(qc_with(sym=False))))
    write(T, "bad_group_64", j(config(qc_with(group_size=64))))
    write(T, "bad_data_type", j(config(qc_with(data_type="nf4"))))
    write(T, "bad_method", j(config(qc_with(quant_method="gptq" + "x" * 70))))
    write(T, "bad_packing", j(config(qc_with(packing_format="auto_round:auto_awq"))))
    write(T, "bad_blocks_type", j(config(qc_with(block_name_to_quantize=7))))
    write(T, "bad_extra_not_object", j(config(qc_with(extra_config=["x"]))))
    write(T, "routing_qweight_held_16", j(config(qc_with(extra_config={
        "model.layers.0.self_attn.q_proj": {"bits": 16},
        "model.layers.1.self_attn.o_proj": {"bits": 16}}))))
    write(T, "routing_outside_blocks", j(config(qc_with(block_name_to_quantize="model.vision"))))
    write(T, "routing_4bit_override_on_bf16", j(config(qc_with(extra_config={
        "lm_head": {"bits": 4, "group_size": 128, "sym": True, "data_type": "int"},
        "model.layers.1.self_attn.o_proj": {"bits": 16}}))))
    write(T, "no_quantization_config", j({"_name_or_path": "/", "quantization_config": None}))
    write(T, "index_missing_shard", j({"weight_map": {"a": "model-00009-of-00009.safetensors"}}))
    write(T, "index_bad_shard_name", j({"weight_map": {"a": "../x.safetensors"}}))
    wm = dict(index["weight_map"])
    wm["model.norm.weight"] = SHARD1_NAME
    write(T, "index_wrong_shard", j({"weight_map": wm}))
    write(T, "not_an_object", "[1, 2, 3]")
    write(T, "duplicate_keys", '{"quantization_config": {}, "quantization_config": {}}')


# ---- client (a daemon's replies and segment) ------------------------------

SHM_MAGIC = 0x314D485345434E41


def segment_image(sq=4, cq=8, arena=65536, cq_results=(), corrupt=None):
    """Header (proto/shm.h layout: sq ring at 64, cq ring at 256, each ring
    head +0, tail +64, sleeping +128, entries +132) and CQ slots."""
    sq_off, cq_off = 4096, 8192
    arena_off = cq_off + 4096
    seg = arena_off + arena
    h = bytearray(cq_off + 256 * cq)
    struct.pack_into("<QIIQIIQQQQ", h, 0, SHM_MAGIC, 1, 4096, seg, 256, 0, sq_off, cq_off, arena_off, arena)
    struct.pack_into("<I", h, 64 + 132, sq)
    struct.pack_into("<I", h, 256 + 132, cq)
    struct.pack_into("<I", h, 256 + 64, len(cq_results))     # cq tail
    for i, body in enumerate(cq_results):
        struct.pack_into("<I", h, cq_off + 256 * i, len(body))
        h[cq_off + 256 * i + 4: cq_off + 256 * i + 4 + len(body)] = body
    if corrupt:
        off, fmt, v = corrupt
        struct.pack_into(fmt, h, off, v)
    return bytes(h), seg


def client_seeds():
    T = "fuzz_client"
    sm = lambda tag, field, body=b"": cmsg(tag, field, body)
    welcome = sm(1, 2, fv(1, 1) + fb(2, "0.1.0") + fb(3, "cpu") + fb(4, "fuzz") + fv(5, 1) + fv(6, 16))
    layer0 = fv(1, 0) + fb(2, "model.layers.0.self_attn.q_proj") + fv(3, 1) + fv(4, 16) + fv(5, 128) + \
        fv(6, 1) + fv(7, 2176)
    layer1 = fv(1, 1) + fb(2, "lm_head") + fv(3, 2) + fv(4, 8) + fv(5, 16) + fv(7, 256)
    other = fb(1, "model.norm.weight") + fb(2, "F32") + fb(3, varint(16))
    info = fv(1, 1) + fb(2, "tiny-w4g128") + fv(3, 4096) + fv(5, 1) + fb(6, layer0) + fb(6, layer1) + fb(7, other)
    stats = fb(1, fv(1, 3) + fv(9, 1) + fv(10, 5)) + fb(2, fv(1, 1)) + \
        fb(3, fv(1, 1) + fb(2, "fuzz") + fv(3, 42) + fv(4, 0) + fb(5, fv(1, 1)))
    res = lambda rid, st=0, err=None: fv(1, rid) + (fv(2, st) if st else b"") + (fb(3, err) if err else b"")
    img, seg = segment_image(cq_results=[res(1), res(2, 22, "rows 9 outside 1..8")])
    session = (welcome + sm(2, 6, fb(1, fv(1, 1) + fb(2, "tiny-w4g128"))) +
               sm(3, 5, fv(1, 100) + fv(2, 2176)) + sm(3, 5, fv(1, 2176) + fv(2, 2176)) + sm(3, 4, info) +
               sm(4, 4, info) + sm(5, 4, info) + sm(6, 8, stats) + sm(7, 7, fv(1, seg)) + sm(8, 9))

    def with_seg(image, stream):
        return struct.pack("<H", len(image)) + image + stream
    write(T, "valid_session", with_seg(img, session))
    write(T, "handshake_only", with_seg(b"", welcome))
    write(T, "handshake_error", with_seg(b"", sm(1, 3, fv(1, 71) + fb(2, "protocol 1 not supported"))))
    write(T, "wrong_tag", with_seg(b"", sm(9, 2, fv(1, 1))))
    write(T, "unsolicited_then_eof", with_seg(b"", welcome + sm(0, 3, fv(1, 71) + fb(2, "violation"))))
    write(T, "error_codes", with_seg(b"", welcome + sm(2, 3, fv(1, 0)) + sm(3, 3, fv(1, 5000)) +
                                     sm(4, 3, fv(1, (1 << 64) - 1))))
    write(T, "empty_and_bad_frames", with_seg(b"", welcome + frame(fv(1, 2)) + struct.pack("<I", 0)))
    bad = segment_image(corrupt=(0, "<Q", 0))[0]
    write(T, "segment_bad_magic", with_seg(bad, session))
    bad = segment_image(corrupt=(40, "<Q", 4096))[0]
    write(T, "segment_overlapping_cq", with_seg(bad, session))
    bad = segment_image(corrupt=(256 + 132, "<I", 3))[0]
    write(T, "segment_cq_not_pow2", with_seg(bad, session))
    img2, seg2 = segment_image(cq_results=[res(7)] * 8, corrupt=(256 + 64, "<I", 0xFFFFFFF0))
    write(T, "segment_cq_tail_wild", with_seg(img2, session.replace(fv(1, seg), fv(1, seg2))))
    img3, _ = segment_image()
    write(T, "segment_size_mismatch", with_seg(img3, session.replace(fv(1, seg), fv(1, 1 << 40))))
    # shared tensors: a daemon that serves them (Welcome field 30), then a
    # listing and a mapping (field 31, with a sealed memfd) before release
    welcome_t = sm(1, 2, fv(1, 1) + fb(2, "0.1.0") + fb(3, "cpu") + fb(4, "fuzz") + fv(5, 1) +
                   fv(6, 16) + fv(30, 1))
    norm = fb(1, "model.norm.weight") + fb(2, "F32") + fb(3, varint(16)) + fv(5, 64)
    emb = fb(1, "model.embed_tokens.weight") + fb(2, "BF16") + fb(3, varint(4) + varint(8)) + \
        fv(4, 64) + fv(5, 64)
    tl = fv(1, 1) + fv(2, 4096) + fb(3, emb) + fb(3, norm)
    head = (welcome_t + sm(2, 6, fb(1, fv(1, 1) + fb(2, "tiny-w4g128"))) +
            sm(3, 5, fv(1, 2176) + fv(2, 2176)) + sm(3, 4, info) + sm(4, 4, info) + sm(5, 4, info) +
            sm(6, 8, stats) + sm(7, 7, fv(1, seg)))
    write(T, "tensors_valid", with_seg(img, head + sm(8, 30, tl) + sm(9, 31, tl) + sm(10, 9)))
    past = fv(1, 1) + fv(2, 4096) + fb(3, fb(1, "x") + fb(2, "F32") + fb(3, varint(1024)) +
                                      fv(4, 1024) + fv(5, 4096))
    wrong = fv(1, 1) + fv(2, 4096) + fb(3, fb(1, "x") + fb(2, "BF16") + fb(3, varint(3)) + fv(5, 4))
    odd = fv(1, 1) + fv(2, 4096) + fb(3, fb(1, "x") + fb(2, "F32") + fb(3, varint(1)) + fv(4, 3) + fv(5, 4))
    huge = fv(1, 1) + fv(2, 1 << 40) + fb(3, fb(1, "x") + fb(2, "U8") + fb(3, varint(8)) + fv(5, 8))
    scalar = fv(1, 1) + fv(2, 4096) + fb(3, fb(1, "s") + fb(2, "F4") + fv(5, 0)) + \
        fb(3, fb(1, "big") + fb(2, "F64") + fb(3, varint(1 << 62) + varint(8)) + fv(5, 0))
    write(T, "tensors_bad", with_seg(img, head + sm(8, 30, past) + sm(9, 31, wrong) + sm(10, 9)))
    write(T, "tensors_odd", with_seg(img, head + sm(8, 30, odd) + sm(9, 31, huge) + sm(10, 9)))
    write(T, "tensors_shapes", with_seg(img, head + sm(8, 30, scalar) + sm(9, 31, scalar) + sm(10, 9)))
    write(T, "model_info_odd", with_seg(b"", welcome + sm(2, 6, fb(1, b"")) +
                                        sm(3, 4, fv(1, 1) + fb(6, fv(1, 7) + fv(3, 9)) + fb(6, fv(1, 7)) +
                                           fb(7, fb(3, varint(1) * 64)))))


if __name__ == "__main__":
    client_seeds()
    safetensors_seeds()
    frame_seeds()
    session_seeds()
    ring_seeds()
    request_seeds()
    quant_config_seeds()
    total = 0
    for root, _, files in os.walk(OUT):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    print(f"seeds written to {OUT}: {total} bytes")
