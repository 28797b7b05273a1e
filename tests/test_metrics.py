"""radiancectl stats --prometheus against a real daemon, checked two ways:

- a strict checker of the Prometheus text exposition format 0.0.4 written
  from the format's rules (metric and label names, HELP/TYPE once and before
  the family's samples, families contiguous, label value escaping, float
  values, no duplicate series, counters >= 0, summary quantiles in [0, 1]
  with _count, histogram buckets cumulative in le order ending with +Inf and
  _count equal to it), itself tested on broken inputs it must refuse;
- prometheus_client's own parser (PyPI, pinned in tests/requirements.txt).

The values are compared with `radiancectl stats --json` and `models --json`
and with what the test did: one examples/linear request of 4 rows, and a
preload whose directory name has a double quote and a backslash (label
escaping). --output replaces a
file atomically and says radiance_up 0 when the daemon is gone.

Env: RADIANCED, RADIANCECTL, RADIANCE_BUILD, RADIANCE_TEST_DATA.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from prometheus_client.parser import text_string_to_metric_families

BUILD = os.environ.get("RADIANCE_BUILD", "build")
RADIANCED = os.environ.get("RADIANCED", BUILD + "/radianced")
RADIANCECTL = os.environ.get("RADIANCECTL", BUILD + "/radiancectl")
DATA = os.environ.get("RADIANCE_TEST_DATA", "tests/data")
LINEAR = BUILD + "/examples/linear"

passed = 0
failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
        print("ok:", what)
    else:
        failed += 1
        print("FAIL:", what)


# --- the strict checker ------------------------------------------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
# a label value: any character but \ " and newline, or one of the three escapes
LVALUE = r'"(?:[^"\\\n]|\\\\|\\"|\\n)*"'
SAMPLE = re.compile(
    r"^(%s)(?:\{((?:%s=%s)(?:,%s=%s)*,?)?\})? (\S+)(?: (-?[0-9]+))?$" % (NAME, LABEL, LVALUE, LABEL, LVALUE))
PAIR = re.compile(r"(%s)=(%s)" % (LABEL, LVALUE))
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def unescape(v):
    return re.sub(r'\\(.)', lambda m: {"n": "\n", "\\": "\\", '"': '"'}[m.group(1)], v[1:-1])


def parse_value(s):
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    if not re.match(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$", s):
        raise ValueError("value %r is not a float" % s)
    return float(s)


def family_of(name, types):
    """The family a sample name belongs to, given the TYPE lines seen."""
    for suffix, kinds in (("_bucket", ("histogram",)), ("_sum", ("histogram", "summary")),
                          ("_count", ("histogram", "summary"))):
        if name.endswith(suffix) and types.get(name[: -len(suffix)]) in kinds:
            return name[: -len(suffix)]
    return name


def strict_parse(text):
    """Returns {family: {"type", "help", "samples": [(name, labels, value)]}}
    or raises ValueError naming the line and the rule it breaks."""
    if not text.endswith("\n"):
        raise ValueError("the exposition does not end with a newline")
    fams = {}
    types = {}
    order = []          # families in the order their samples appear
    seen = set()
    for no, line in enumerate(text.split("\n")[:-1], 1):
        where = "line %d %r" % (no, line)
        if line.startswith("#"):
            m = re.match(r"^# (HELP|TYPE) (%s)(?: (.*))?$" % NAME, line)
            if not m:
                continue  # another comment
            kind, name, rest = m.group(1), m.group(2), m.group(3) or ""
            f = fams.setdefault(name, {"type": None, "help": None, "samples": []})
            if f["samples"]:
                raise ValueError("%s: %s after the family's samples" % (where, kind))
            if kind == "TYPE":
                if f["type"] is not None:
                    raise ValueError("%s: second TYPE for %s" % (where, name))
                if rest not in TYPES:
                    raise ValueError("%s: unknown type %r" % (where, rest))
                f["type"] = rest
                types[name] = rest
            else:
                if f["help"] is not None:
                    raise ValueError("%s: second HELP for %s" % (where, name))
                if re.search(r"\\[^\\n]", rest):
                    raise ValueError("%s: bad escape in HELP" % where)
                f["help"] = rest
            continue
        if not line.strip():
            continue
        m = SAMPLE.match(line)
        if not m:
            raise ValueError("%s: not a sample (name{label=\"value\",...} value)" % where)
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        pairs = [(k, unescape(v)) for k, v in PAIR.findall(labels)]
        if len({k for k, _ in pairs}) != len(pairs):
            raise ValueError("%s: a label given twice" % where)
        v = parse_value(value)
        fam = family_of(name, types)
        f = fams.setdefault(fam, {"type": None, "help": None, "samples": []})
        if order and order[-1] != fam and fam in order:
            raise ValueError("%s: family %s is not contiguous" % (where, fam))
        if not order or order[-1] != fam:
            order.append(fam)
        key = (name, tuple(sorted(pairs)))
        if key in seen:
            raise ValueError("%s: duplicate series" % where)
        seen.add(key)
        f["samples"].append((name, dict(pairs), v))
    for fam, f in fams.items():
        t = f["type"] or "untyped"
        s = f["samples"]
        if t == "counter":
            for n, _, v in s:
                if not (v >= 0):
                    raise ValueError("counter %s is %r" % (n, v))
        if t == "summary":
            for n, lab, v in s:
                if n == fam:
                    q = float(lab.get("quantile", "x") if re.match(r"^[0-9.]+$", lab.get("quantile", "x")) else "nan")
                    if not (0 <= q <= 1):
                        raise ValueError("summary %s: quantile %r" % (fam, lab.get("quantile")))
            if s and not any(n == fam + "_count" for n, _, _ in s):
                raise ValueError("summary %s has no _count" % fam)
        if t == "histogram":
            groups = {}
            for n, lab, v in s:
                rest = tuple(sorted((k, x) for k, x in lab.items() if k != "le"))
                groups.setdefault(rest, {"buckets": [], "count": None, "sum": None})
                g = groups[rest]
                if n == fam + "_bucket":
                    if "le" not in lab:
                        raise ValueError("histogram %s: bucket without le" % fam)
                    g["buckets"].append((parse_value(lab["le"]), v))
                elif n == fam + "_count":
                    g["count"] = v
                elif n == fam + "_sum":
                    g["sum"] = v
                else:
                    raise ValueError("histogram %s: stray sample %s" % (fam, n))
            for rest, g in groups.items():
                b = g["buckets"]
                if not b or b[-1][0] != math.inf:
                    raise ValueError("histogram %s%s: buckets do not end with le=\"+Inf\"" % (fam, rest))
                if [x for x, _ in b] != sorted(x for x, _ in b):
                    raise ValueError("histogram %s%s: le not increasing" % (fam, rest))
                if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
                    raise ValueError("histogram %s%s: buckets not cumulative" % (fam, rest))
                if g["count"] is None or g["sum"] is None:
                    raise ValueError("histogram %s%s: _count or _sum missing" % (fam, rest))
                if g["count"] != b[-1][1]:
                    raise ValueError("histogram %s%s: _count %r != +Inf bucket %r" % (fam, rest, g["count"], b[-1][1]))
    return fams


def refuses(text):
    try:
        strict_parse(text)
    except ValueError as e:
        return str(e)
    return None


def checker_self_test():
    good_hist = ('# TYPE h histogram\nh_bucket{le="0.1"} 1\nh_bucket{le="1"} 3\n'
                 'h_bucket{le="+Inf"} 4\nh_sum 2.5\nh_count 4\n')
    check(refuses(good_hist) is None, "checker accepts a well-formed histogram")
    bad = {
        "histogram not cumulative": good_hist.replace('le="1"} 3', 'le="1"} 0'),
        "histogram without +Inf": good_hist.replace('h_bucket{le="+Inf"} 4\n', ""),
        "histogram _count != +Inf bucket": good_hist.replace("h_count 4", "h_count 5"),
        "histogram without _sum": good_hist.replace("h_sum 2.5\n", ""),
        "TYPE after samples": "a 1\n# TYPE a gauge\n",
        "second TYPE": "# TYPE a gauge\n# TYPE a counter\na 1\n",
        "bad label escape": '# TYPE a gauge\na{m="x\\q"} 1\n',
        "unescaped quote": '# TYPE a gauge\na{m="x"y"} 1\n',
        "not a number": "# TYPE a gauge\na one\n",
        "negative counter": "# TYPE a_total counter\na_total -1\n",
        "duplicate series": "# TYPE a gauge\na 1\na 2\n",
        "family split": "# TYPE a gauge\n# TYPE b gauge\na{x=\"1\"} 1\nb 1\na{x=\"2\"} 1\n",
        "summary without _count": '# TYPE s summary\ns{quantile="0.5"} 1\n',
        "quantile out of range": '# TYPE s summary\ns{quantile="2"} 1\ns_count 1\n',
        "no final newline": "# TYPE a gauge\na 1",
        "bad metric name": "# TYPE a gauge\n1a 1\n",
    }
    for what, text in bad.items():
        check(refuses(text) is not None, "checker refuses: %s (%s)" % (what, refuses(text)))


# --- against the daemon ------------------------------------------------------

def ctl(sock, *args):
    return subprocess.run([RADIANCECTL, "--socket", sock] + list(args), capture_output=True, text=True)


def main():
    checker_self_test()
    tmp = tempfile.mkdtemp()
    daemon = None
    try:
        # a model name with a double quote and a backslash: label escaping
        model = 'mini"lm\\w4'
        mdir = os.path.join(tmp, model)
        shutil.copytree(os.path.join(DATA, "minilm-w4g128"), mdir)
        sock = os.path.join(tmp, "r.sock")
        log = open(os.path.join(tmp, "daemon.log"), "w")
        daemon = subprocess.Popen([RADIANCED, "--no-config", "--backend", "cpu", "--socket", sock,
                                   "--preload", mdir], stdout=log, stderr=subprocess.STDOUT)
        for _ in range(400):
            if ctl(sock, "status").returncode == 0:
                break
            time.sleep(0.05)
        else:
            check(False, "daemon came up")
            return
        env = dict(os.environ, RADIANCE_SOCKET=sock)
        r = subprocess.run([LINEAR, mdir, "encoder.layer.0.attention.self.query", "4"], env=env,
                           capture_output=True, text=True)
        check(r.returncode == 0, "examples/linear ran 4 rows (exit %d) %s" % (r.returncode, r.stderr.strip()))

        p = ctl(sock, "stats", "--prometheus")
        check(p.returncode == 0, "radiancectl stats --prometheus exits 0 (%s)" % p.stderr.strip())
        text = p.stdout
        js = json.loads(ctl(sock, "stats", "--json").stdout)["global"]
        models = json.loads(ctl(sock, "models", "--json").stdout)
        try:
            fams = strict_parse(text)
            check(True, "strict checker accepts the output (%d families)" % len(fams))
        except ValueError as e:
            check(False, "strict checker: %s" % e)
            print(text)
            return
        for f, d in fams.items():
            check(d["type"] is not None and d["help"], "%s has HELP and TYPE %s" % (f, d["type"]))

        def one(name, labels=None):
            fam = fams[family_of(name, {k: v["type"] for k, v in fams.items()})]
            vals = [v for n, lab, v in fam["samples"] if n == name and (labels is None or lab == labels)]
            return vals[0] if len(vals) == 1 else None

        # what the test did, and what --json says (another formatting of the reply)
        check(one("radiance_up") == 1, "radiance_up 1")
        check(one("radiance_rows_total") == 4 and js["rows"] == 4,
              "rows_total %r == 4 (json %r)" % (one("radiance_rows_total"), js["rows"]))
        check(one("radiance_errors_total") == js["errors"] == 0,
              "errors_total %r == json %r == 0" % (one("radiance_errors_total"), js["errors"]))
        # one linear request; stats and model queries are not requests
        check(one("radiance_requests_total") == js["requests"] == 1,
              "requests_total %r == json %r" % (one("radiance_requests_total"), js["requests"]))
        check(one("radiance_input_bytes_total") == js["bytes_in"] and
              one("radiance_output_bytes_total") == js["bytes_out"],
              "bytes in/out %r/%r == json" % (one("radiance_input_bytes_total"), one("radiance_output_bytes_total")))
        # the histogram: one request, whose latency is the exact max
        mx = one("radiance_request_latency_max_seconds")
        max_ns = js["latency_max_ns"]
        check(mx is not None and abs(mx - max_ns / 1e9) < 1e-12 and max_ns > 0, "max %r s == json" % mx)
        hist = [(lab["le"], v) for n, lab, v in fams["radiance_request_latency_seconds"]["samples"]
                if n == "radiance_request_latency_seconds_bucket"]
        check(len(hist) == 26 and hist[-1] == ("+Inf", 1.0), "26 buckets ending with +Inf 1 (%d)" % len(hist))
        wrong = []
        for le, v in hist[:-1]:
            sec, frac = le.split(".")
            le_ns = int(sec) * 10**9 + int(frac)
            if le_ns + 1 & le_ns:
                wrong.append("le %s is not 2^k-1 ns" % le)
            if v != (1 if max_ns <= le_ns else 0):
                wrong.append("le %s: %r" % (le, v))
        check(not wrong, "each bucket counts the request iff its %d ns fit: %s" % (max_ns, wrong or "all right"))
        check(one("radiance_request_latency_seconds_count") == js["requests"] and
              abs(one("radiance_request_latency_seconds_sum") - max_ns / 1e9) < 1e-12,
              "_count == requests, _sum == the one request's latency")
        p50 = one("radiance_request_latency_p50_seconds")
        p99 = one("radiance_request_latency_p99_seconds")
        check(p50 is not None and abs(p50 - js["latency_p50_ns"] / 1e9) < 1e-12 and
              abs(p99 - js["latency_p99_ns"] / 1e9) < 1e-12 and 0 < p50 <= p99 <= mx,
              "latency p50 %r <= p99 %r <= max %r s, as json's ns" % (p50, p99, mx))
        check(one("radiance_sessions") == 1, "sessions 1 (radiancectl's own)")
        m = [x for x in models["models"]] if isinstance(models, dict) else models
        check(one("radiance_models") == len(m) == 1, "models 1")
        rb = one("radiance_model_resident_bytes", {"model": model})
        want = m[0]["resident_bytes"] if m else None
        check(rb is not None and rb == want and rb > 0,
              "resident_bytes{model=%r} %r == models --json %r (label unescaped back)" % (model, rb, want))
        info = fams["radiance_info"]["samples"][0][1]
        check(info.get("backend") == "cpu", "radiance_info backend=%r" % info.get("backend"))

        # prometheus_client's parser reads the same numbers
        pc = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                pc[(s.name, tuple(sorted(s.labels.items())))] = s.value
        check(pc.get(("radiance_rows_total", ())) == 4, "prometheus_client: radiance_rows_total 4")
        check(pc.get(("radiance_model_resident_bytes", (("model", model),))) == rb,
              "prometheus_client: the escaped model label round-trips")
        n_strict = sum(len(d["samples"]) for d in fams.values())
        check(len(pc) == n_strict, "prometheus_client sees %d samples, the strict checker %d" % (len(pc), n_strict))

        # --output: replaced atomically, nothing left beside it
        out = os.path.join(tmp, "textfile", "radiance.prom")
        os.mkdir(os.path.dirname(out))
        with open(out, "w") as f:
            f.write("old\n")
        r = ctl(sock, "stats", "--prometheus", "--output", out)
        content = open(out).read()
        check(r.returncode == 0 and "radiance_up 1\n" in content and strict_parse(content) is not None,
              "--output wrote a valid file")
        check(os.listdir(os.path.dirname(out)) == ["radiance.prom"], "no temporary file left beside it")
        check(ctl(sock, "stats", "--output", out).returncode == 2, "--output without --prometheus: usage error")
        check(ctl(sock, "status", "--prometheus").returncode == 2, "--prometheus on status: usage error")

        daemon.terminate()
        daemon.wait(timeout=20)
        daemon = None
        r = ctl(sock, "stats", "--prometheus", "--output", out)
        content = open(out).read()
        fams = strict_parse(content)
        check(r.returncode == 3 and [s[2] for s in fams["radiance_up"]["samples"]] == [0] and len(fams) == 1,
              "daemon gone: exit %d, the file says only radiance_up 0" % r.returncode)
    finally:
        if daemon:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)


main()
print("test_metrics: %d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
