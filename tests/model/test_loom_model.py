"""CPU tests of the performance model (tools/loom_model). Standard library only:
PYTHONPATH=tools python3 -m unittest discover -s tests/model (scripts/test.sh runs them)."""
import copy
import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from loom_model import comm, gemm, ops, params, validate  # noqa: E402
from loom_model.params import ParamError  # noqa: E402
from loom_model.topology import Topology  # noqa: E402

HW = ("h100", "h200", "h800")


def increasing(values):
    return all(b >= a for a, b in zip(values, values[1:]))


class Monotonic(unittest.TestCase):
    """More work never takes less time (the fitted model, and ops at shapes no table row overrides), but where Loom's
    own rules make it so: a collective's block count, an overlapped op's choice of algorithm."""

    def test_gemm_in_each_dimension(self):
        for hw in HW:
            p = params.load(hw)
            for dim in range(3):
                times = []
                for v in (1, 16, 100, 128, 129, 1000, 4096, 5000, 16384, 65536):
                    shape = [5000, 3000, 7000]
                    shape[dim] = v
                    times.append(gemm.fitted_us(p, *shape))
                self.assertTrue(increasing(times), f"{hw} dim {dim}: {times}")

    def test_collectives_in_bytes_and_nodes(self):
        """At powers of two. Between them a small call's time has a sawtooth, as Loom's: one more block (one per
        64-128 KiB) makes a size just past a block boundary faster than the one before it; the drop stays below
        what one block moves."""
        for hw in HW:
            p = params.load(hw)
            tops = [Topology(nodes, 8) for nodes in (1, 2, 16, 128)]
            if hw == "h200":
                tops += [Topology(1, 2)] + [Topology(shared_ranks=r) for r in (2, 4, 8)]
            for name in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all"):
                for t in tops:
                    times = [ops.collective(p, t, name, 1 << s)["overlapped_us"] for s in range(10, 32)]
                    self.assertTrue(increasing(times), f"{hw} {name} {t}: {times}")
                    if t.nodes > 1:
                        continue
                    rate = comm.block_rate(p, t)
                    prev = None
                    for size in range(1 << 10, 1 << 25, 1 << 14):
                        us = ops.collective(p, t, name, size)["overlapped_us"]
                        if prev is not None:
                            self.assertGreater(us, prev - 2 * 128 * 1024 / rate, f"{hw} {name} {t} {size}")
                        prev = us

    def test_overlapped_ops_in_sizes(self):
        """Under one algorithm; where Auto's rule (a wave count) switches algorithm the time may drop, as Loom's."""
        for hw in HW:
            p = params.load(hw)
            for op in ("ag_gemm", "gemm_rs", "gemm_ar"):
                for t in (Topology(1, 8), Topology(4, 8), Topology(shared_ranks=4) if hw == "h200" else None):
                    if t is None:
                        continue
                    for dim in range(3):
                        runs, sq = [], []
                        for v in (256, 1000, 3000, 9000, 30000):
                            shape = [5000, 7000, 11000]
                            shape[dim] = v
                            r = getattr(ops, op)(p, t, *shape)
                            if not runs or runs[-1][0] != r["algorithm"]:
                                runs.append((r["algorithm"], []))
                            runs[-1][1].append(r["overlapped_us"])
                            sq.append(r["sequential_us"])
                        for algo, ov in runs:
                            self.assertTrue(increasing(ov), f"{hw} {op} {t} dim {dim} {algo}: {ov}")
                        self.assertTrue(increasing(sq), f"{hw} {op} {t} dim {dim}: {sq}")

    def test_auto_switches_algorithm_by_waves(self):
        """One GPU per rank on one node, Auto's rules: ag_gemm runs the sequence while its tiles fit one wave;
        gemm_rs the fused epilogue to one wave, the sequence below three, the chunked overlap beyond; gemm_ar the
        fused epilogue to one wave, the sequence beyond (and at every M with ranks sharing a GPU)."""
        p = params.load("h200")
        t = Topology(1, 2)
        self.assertEqual(ops.ag_gemm(p, t, 512, 11008, 4096)["algorithm"], "sequence")  # 4 x 22 = 88 tiles
        self.assertEqual(ops.ag_gemm(p, t, 1024, 11008, 4096)["algorithm"], "chunked")  # 176 tiles
        self.assertEqual(ops.gemm_rs(p, t, 1024, 4096, 11008)["algorithm"], "fused_epilogue")  # 128 tiles
        self.assertEqual(ops.gemm_rs(p, t, 2048, 4096, 11008)["algorithm"], "sequence")  # 256 tiles
        self.assertEqual(ops.gemm_rs(p, t, 4096, 4096, 11008)["algorithm"], "chunked")  # 512 tiles
        self.assertEqual(ops.gemm_ar(p, t, 16, 8192, 8192)["algorithm"], "fused_epilogue")
        self.assertEqual(ops.gemm_ar(p, t, 8192, 5120, 8192)["algorithm"], "sequence")  # 1280 tiles
        for m in (16, 16384):
            self.assertEqual(ops.gemm_ar(p, Topology(shared_ranks=4), m, 5120, 8192)["algorithm"], "sequence")

    def test_ep_and_decode(self):
        p = params.load("h800")
        for phase in ("dispatch", "combine"):
            times = [ops.ep_ll(p, Topology(4, 8), phase, tokens, 7168, 8)["overlapped_us"] for tokens in (1, 64, 128, 4096)]
            self.assertTrue(increasing(times), times)
        times = [ops.sp_decode(p, Topology(1, 8), 1, kv, 32, 8, 128)["overlapped_us"] for kv in (1024, 8192, 1 << 20)]
        self.assertTrue(increasing(times), times)

    def test_ep_throughput_mode(self):
        # A token of top-1 reaches one rank with one slot; top-8 of 256 on 8 ranks about 5.29 ranks (bench-ep
        # measures 272 MB per rank of rows to other ranks at T = 4096, H = 7168: 4096 x 5.29 x 7 / 8 x 14336 B).
        self.assertEqual(ops.ep_routing(8, 256, 1), (1.0, 1.0))
        ranks, single = ops.ep_routing(8, 256, 8)
        self.assertAlmostEqual(ranks, 5.2947, places=3)
        self.assertAlmostEqual(4096 * ranks * 7 / 8 * 14336 / 1e6, 272.0, delta=1.0)
        self.assertTrue(0 < single < ranks)
        for hw, t in (("h200", Topology(shared_ranks=8)), ("h800", Topology(1, 8)), ("h800", Topology(4, 8))):
            p = params.load(hw)
            for phase in ("dispatch", "combine"):
                times = [ops.ep_normal(p, t, phase, tokens, 7168, 8, 256)["overlapped_us"]
                         for tokens in (1, 128, 4096, 16384)]
                self.assertTrue(increasing(times), (hw, t, phase, times))
        # Across nodes the IB share binds: more nodes, more of the rows on the network.
        p = params.load("h800")
        one, two = (ops.ep_normal(p, Topology(n, 8), "dispatch", 4096, 7168, 8, 256)["overlapped_us"] for n in (1, 2))
        self.assertGreater(two, 2 * one)

    def test_overlap_never_slower_than_its_parts_nor_faster_than_the_larger(self):
        p = params.load("h800")
        for op in ("ag_gemm", "gemm_rs", "gemm_ar"):
            for t in (Topology(1, 8), Topology(2, 8), Topology(16, 8)):
                r = getattr(ops, op)(p, t, 8192, 8192, 8192)
                self.assertGreaterEqual(r["overlapped_us"], max(r["gemm_us"], r["comm_us"]) - 1e-9, (op, t))


class MeasuredPoints(unittest.TestCase):
    """At a shape docs/perf measured, the model returns the measurement it was given."""

    def test_gemm_returns_measured_rows(self):
        p = params.load("h200")
        with open(os.path.join(ROOT, "docs", "perf", "gemm.json")) as f:
            rows = json.load(f)["rows"]
        self.assertTrue(rows)
        for r in rows:
            self.assertEqual(gemm.gemm_us(p, r["m"], r["n"], r["k"]), r["loom_us"], r["shape"])
            # the fit alone stays close to every measured row
            fit = gemm.fitted_us(p, r["m"], r["n"], r["k"])
            self.assertLess(abs(fit / r["loom_us"] - 1), 0.15, r["shape"])

    def test_single_rank_ops_are_the_gemm(self):
        p = params.load("h200")
        t = Topology(1, 1)
        with open(os.path.join(ROOT, "docs", "perf", "gemm.json")) as f:
            rows = json.load(f)["rows"]
        for r in rows:
            for op in ("ag_gemm", "gemm_rs", "gemm_ar"):
                res = getattr(ops, op)(p, t, r["m"], r["n"], r["k"])
                self.assertEqual(res["overlapped_us"], r["loom_us"])
                self.assertEqual(res["speedup"], 1.0)

    def test_nvlink_and_shared_copy_rates_are_the_measured_ones(self):
        p = params.load("h200")
        with open(os.path.join(ROOT, "docs", "perf", "all_gather.json")) as f:
            rows = [r for r in json.load(f)["rows"] if r.get("algo") == "auto" and r["size_bytes"] == 1 << 30
                    and r["shared_gpu"] and "timing" not in r]
        self.assertEqual(sorted(r["ranks"] for r in rows), [2, 4, 8])
        for r in rows:
            # the fan-out push reads the input once and writes W outputs: (W + 1) x S bytes of HBM traffic
            traffic = (r["ranks"] + 1) * r["size_bytes"] / r["loom_us"] / 1e3
            self.assertAlmostEqual(p["shared_gpu"]["traffic_GBps_by_ranks"][str(r["ranks"])], traffic, delta=0.5)
            bw_only = ops.collective(p, Topology(shared_ranks=r["ranks"]), "all_gather", r["size_bytes"])
            self.assertLess(abs(bw_only["overlapped_us"] / r["loom_us"] - 1), 0.02)
        with open(os.path.join(ROOT, "docs", "perf", "lang_put.json")) as f:
            put = [r for r in json.load(f)["rows"] if r["bytes"] == 1 << 30 and r["path"] == "ldst"
                   and r["machine"].startswith("two H200s") and r.get("blocks") is None]
        self.assertEqual(len(put), 1)
        self.assertAlmostEqual(comm.nvlink_rate(p) / 1e3, put[0]["GBps"], delta=0.01 * put[0]["GBps"])

    def test_shared_ll_rate_is_the_measured_one(self):
        """shared_gpu.ll_traffic_GBps: the 8-rank shared all_gather's LL call, 1 MiB less 1 KiB, carries twice the
        fan-out's (W + 1) S bytes of HBM traffic (a flag word beside every data word)."""
        p = params.load("h200")
        with open(os.path.join(ROOT, "docs", "perf", "all_gather.json")) as f:
            rows = {r["size_bytes"]: r for r in json.load(f)["rows"]
                    if r.get("algo") == "auto" and r.get("ranks") == 8 and r.get("shared_gpu") and "timing" not in r
                    and not r.get("out_plain") and r["size_bytes"] in (1 << 10, 1 << 20)}
        self.assertEqual(rows[1 << 20]["auto_choice"], "ll/ld")
        rate = 2 * 9 * (1 << 20) / (rows[1 << 20]["loom_us"] - rows[1 << 10]["loom_us"]) / 1e3
        self.assertAlmostEqual(p["shared_gpu"]["ll_traffic_GBps"], rate, delta=0.5)
        # Below a plain copy's rate with as many ranks: the receivers' polls re-read the packets.
        self.assertLess(p["shared_gpu"]["ll_traffic_GBps"], p["shared_gpu"]["traffic_GBps_by_ranks"]["8"])

    # Loom's rows the model misses by more than 25 % (docs/model.md, "Known gaps", says why).
    KNOWN_GAPS = {("gemm_ar", "2 ranks sharing one GPU", "128x8192x28672")}

    def test_measured_rows_within_tolerance_but_the_known_gaps(self):
        rows = validate.measured_table()
        wheres = {r["where"] for r in rows}
        for w in ("1 node x 2 GPUs", "2 ranks sharing one GPU", "4 ranks sharing one GPU", "8 ranks sharing one GPU"):
            self.assertIn(w, wheres)
        keys = {(r["op"], r["where"], r["shape"]) for r in rows}
        self.assertLessEqual(self.KNOWN_GAPS, keys)
        for r in rows:
            if (r["op"], r["where"], r["shape"]) not in self.KNOWN_GAPS:
                self.assertLessEqual(abs(r["error"]), 0.25, r)

    def test_shared_collectives_are_bound_by_hbm_traffic(self):
        """Ranks sharing a GPU: at 1 GiB every collective is its HBM traffic (coll_choice.cpp's units) over the
        measured rate; all_to_all moves 2 W S bytes to the fan-out all_gather's (W + 1) S."""
        p = params.load("h200")
        for w in (2, 4, 8):
            t = Topology(shared_ranks=w)
            ag = ops.collective(p, t, "all_gather", 1 << 30)["overlapped_us"]
            a2a = ops.collective(p, t, "all_to_all", 1 << 30)["overlapped_us"]
            self.assertAlmostEqual((a2a - comm.alpha(p, t)) / (ag - comm.alpha(p, t)), 2 * w / (w + 1), delta=0.01)


class Published(unittest.TestCase):
    def test_every_figure_has_a_source_and_reproduces_within_tolerance(self):
        doc = validate.load_published()
        self.assertEqual(doc["tolerance"], 0.25)
        ids = [f["id"] for f in doc["figures"]]
        self.assertEqual(len(ids), len(set(ids)))
        for f in doc["figures"]:
            for key in ("repo", "path", "commit", "how"):
                self.assertTrue(f["source"].get(key), (f["id"], key))
        rows = validate.published_table()
        self.assertEqual(len(rows), len(doc["figures"]))
        for r in rows:
            self.assertLessEqual(abs(r["error"]), doc["tolerance"], r)

    def test_docs_table_is_the_current_one(self):
        """docs/model.md carries the table `loom-model validate --published --markdown` prints."""
        from loom_model.__main__ import main
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["validate", "--published", "--markdown"])
        with open(os.path.join(ROOT, "docs", "model.md")) as f:
            doc = f.read()
        for line in out.getvalue().splitlines():
            if line.startswith("| td_") or line.startswith("| deepep_"):
                self.assertIn(line, doc, "docs/model.md is stale: regenerate it with loom-model validate --markdown")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["validate", "--measured", "--markdown"])
        rows = [line for line in out.getvalue().splitlines() if line.startswith("| ") and " us " not in line
                and not line.startswith("| op ")]
        self.assertEqual(len(rows), len(validate.measured_table()))
        for line in rows:
            self.assertIn(line, doc, "docs/model.md is stale: regenerate it with loom-model validate --markdown")

    def test_issue_ranges_are_in_the_table(self):
        doc = validate.load_published()
        by_op = {}
        for f in doc["figures"]:
            if f["metric"] == "speedup":
                by_op.setdefault((f["op"], f["nodes"]), []).append(f["value"])
        self.assertEqual((min(by_op[("ag_gemm", 1)]), max(by_op[("ag_gemm", 1)])), (1.30, 1.65))
        self.assertEqual((min(by_op[("gemm_rs", 1)]), max(by_op[("gemm_rs", 1)])), (1.06, 1.58))
        self.assertEqual(max(by_op[("ag_gemm", 2)]), 1.70)
        self.assertEqual(max(by_op[("gemm_rs", 2)]), 1.59)


class ParameterFiles(unittest.TestCase):
    def write(self, d):
        f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(d, f)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def expect(self, mutate, *fragments):
        d = copy.deepcopy(params.load("h200"))
        mutate(d)
        with self.assertRaises(ParamError) as cm:
            params.load(self.write(d))
        for frag in fragments:
            self.assertIn(frag, str(cm.exception))

    def test_shipped_files_are_valid(self):
        self.assertEqual(params.available(), list(HW))
        for hw in HW:
            self.assertEqual(params.load(hw)["name"], hw)

    def test_errors_name_the_field_and_what_was_given(self):
        self.expect(lambda d: d["nvlink"].__setitem__("GBps_per_dir", -3), "nvlink.GBps_per_dir", "positive", "-3")
        self.expect(lambda d: d["nvlink"].__setitem__("efficiency", 1.5), "nvlink.efficiency", "(0, 1]", "1.5")
        self.expect(lambda d: d["ib"].pop("nics_per_node"), "ib.nics_per_node", "missing")
        self.expect(lambda d: d.__setitem__("gpus_per_node", 8.5), "gpus_per_node", "integer", "8.5")
        self.expect(lambda d: d["gpu"].__setitem__("sms", True), "gpu.sms", "integer")
        self.expect(lambda d: d.__setitem__("nvlnk", {}), "nvlnk", "unknown field")
        self.expect(lambda d: d["gpu"]["gemm"].__setitem__("table", "docs/perf/nothing.json"), "gpu.gemm.table",
                    "nothing.json")
        self.expect(lambda d: d["shared_gpu"]["traffic_GBps_by_ranks"].__setitem__("one", 5), "traffic_GBps_by_ranks",
                    "'one'")
        self.expect(lambda d: d["shared_gpu"]["call_us_by_ranks"].__setitem__("4", -1), "call_us_by_ranks.4", "-1")
        self.expect(lambda d: d["gpu"].pop("barrier_us"), "gpu.barrier_us", "missing")
        self.expect(lambda d: d["shared_gpu"]["sm_fraction_by_ranks"].__setitem__("4", 0), "sm_fraction_by_ranks.4")
        self.expect(lambda d: d["shared_gpu"].__setitem__("ll_traffic_GBps", 0), "shared_gpu.ll_traffic_GBps", "0")
        self.expect(lambda d: d["shared_gpu"].pop("ll_traffic_GBps"), "shared_gpu.ll_traffic_GBps", "missing")
        self.expect(lambda d: d.__setitem__("ll", []), "ll", "expected an object")

    def test_bad_json_and_unknown_names(self):
        bad = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        bad.write("{not json")
        bad.close()
        self.addCleanup(os.unlink, bad.name)
        with self.assertRaisesRegex(ParamError, "not valid JSON"):
            params.load(bad.name)
        with self.assertRaisesRegex(ParamError, "available: h100, h200, h800"):
            params.load("h9000")

    def test_op_inputs_are_checked(self):
        p = params.load("h800")
        with self.assertRaisesRegex(ValueError, "ag_gemm: m: expected a positive integer, got 0"):
            ops.ag_gemm(p, Topology(1, 8), 0, 1, 1)
        with self.assertRaisesRegex(ValueError, "no shared_gpu section"):
            ops.collective(p, Topology(shared_ranks=4), "all_gather", 1024)
        with self.assertRaisesRegex(ValueError, "no entry for 3 ranks"):
            ops.collective(params.load("h200"), Topology(shared_ranks=3), "all_gather", 1024)
        with self.assertRaisesRegex(ValueError, "nodes=1"):
            Topology(2, 8, shared_ranks=4)
        with self.assertRaisesRegex(ValueError, "experts a multiple of the ranks \\(8\\)"):
            ops.ep_normal(p, Topology(1, 8), "dispatch", 128, 7168, 8, 100)
        with self.assertRaisesRegex(ValueError, "phase: expected 'dispatch' or 'combine'"):
            ops.ep_normal(p, Topology(1, 8), "both", 128, 7168, 8, 256)


class Cli(unittest.TestCase):
    def test_commands_run(self):
        from loom_model.__main__ import main
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(main(["sweep", "--hw", "h800", "--op", "gemm_rs", "--m", "8192", "--n", "8192", "--k",
                                   "28672"]), 0)
            self.assertEqual(main(["check", os.path.join(params.DATA_DIR, "h800.json")]), 0)
            self.assertEqual(main(["validate", "--published", "--markdown"]), 0)
        out2 = io.StringIO()
        with contextlib.redirect_stdout(out2):
            self.assertEqual(main(["predict", "--hw", "h800", "--op", "ep_normal_combine", "--tokens", "4096", "--hidden",
                                   "7168", "--topk", "8", "--experts", "256", "--nodes", "2"]), 0)
        self.assertIn("2 nodes x 8 GPUs", out2.getvalue())
        with self.assertRaises(SystemExit) as cm:
            main(["predict", "--op", "ep_normal_dispatch", "--tokens", "1", "--hidden", "128", "--topk", "1"])
        self.assertIn("needs --experts", str(cm.exception.code))
        self.assertIn("128 nodes x 8 GPUs", out.getvalue())
        figures = validate.load_published()["figures"]
        n = sum(not f.get("calibration") for f in figures)
        self.assertLess(n, len(figures))  # the calibration rows are not counted as predictions
        self.assertIn(f"{n} of {n} published figures within 25 % (predictions;", out.getvalue())
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(main(["predict", "--hw", "h9000", "--op", "ag_gemm", "--m", "1", "--n", "1", "--k", "1"]), 2)
        self.assertIn("no parameter file named 'h9000'", err.getvalue())


if __name__ == "__main__":
    unittest.main()
