"""fusion_op on real torch.compile jobs (Inductor, CPU): the files, the operator tier's join and
the summary, checked against Inductor's own generated code and the model's own shapes.

One profiled run per job shape (module-scoped: a compile costs ~20 s here); the program
(``tests/programs/compiled_job.py``) writes the paths of the wrapper modules Inductor
generated, which the tests read independently of the plugin's parser.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from conftest import REPO, Runner, jobprof_cli, raw, read_csv, torchrun
from jobprof.plugin.records import CompiledGraphRecord
from jobprof.plugin.values import STEP_MODE_MODEL_ID
from jobprof.plugins.fusion_op import wrapper
from jobprof.plugins.fusion_op.records import CompileCountersRecord
from jobprof.plugins.fusion_op.writer import HEADER

PROGRAM = REPO / "tests" / "programs" / "compiled_job.py"
OPTIONS = {"training_trace": "on", "task_trace": "on"}
# Inductor's own kernel definitions and extern calls, read without the plugin's parser
_DEFINED = re.compile(r"^(\w+) = async_compile\.(?:cpp_pybinding|cpp|triton)\(", re.M)
_EXTERN = re.compile(r"^\s+extern_kernels\.\w+\(", re.M)


class Job:
    def __init__(self, tmp: Path, shape: str, options: dict | None) -> None:
        self.runner = Runner(tmp)
        env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "GENERATED": str(tmp / "generated.json")}
        self.proc = self.runner.run(PROGRAM, options, args=[shape], env=env, timeout=300,
                                    mode="true" if options is not None else None)
        self.losses = [line for line in self.proc.stdout.splitlines() if line.startswith("loss ")]
        self.generated = [Path(p) for p in json.loads((tmp / "generated.json").read_text())]
        self.device = self.runner.device_dir() if options is not None else None

    def fusion_files(self) -> dict[int, list[Path]]:
        """{iteration: fusion_op files written for it}."""
        assert self.device is not None
        out: dict[int, list[Path]] = {}
        for path in sorted((self.device / "summary").glob("fusion_op_*.csv")):
            out.setdefault(int(path.stem.rsplit("_", 1)[1]), []).append(path)
        return out

    def graphs(self) -> dict[int, CompiledGraphRecord]:
        assert self.device is not None
        found: dict[int, CompiledGraphRecord] = {}
        for streams in raw(self.device).values():
            for rec in streams.get(CompiledGraphRecord.STREAM, []):
                graph = CompiledGraphRecord.from_raw(rec)
                assert graph is not None, rec
                found.setdefault(graph.model_id, graph)
        return found


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return Job(tmp_path_factory.mktemp("mlp"), "mlp", OPTIONS)


@pytest.fixture(scope="module")
def mlp_kernels(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return Job(tmp_path_factory.mktemp("mlpk"), "mlp", {**OPTIONS, "fusion_op": "kernels"})


@pytest.fixture(scope="module")
def mlp_plain(tmp_path_factory: pytest.TempPathFactory) -> Job:
    return Job(tmp_path_factory.mktemp("plain"), "mlp", None)


def test_fusion_op_files_match_inductors_generated_code(mlp: Job) -> None:
    files = mlp.fusion_files()
    # compiled in iteration 1 (forward, then backward at the first backward) and recompiled in
    # iteration 3 (the smaller batch): one file per graph, named by its model id
    assert sorted(files) == [1, 3], files
    assert len(files[1]) == 2 and len(files[3]) == 2, files
    rows = []
    for paths in files.values():
        for path in paths:
            text = path.read_text()
            assert text.splitlines()[0] == ",".join(HEADER)
            file_rows = read_csv(path)
            assert {r["Model ID"] for r in file_rows} == {path.stem.split("_")[3]}
            rows += file_rows
    # every kernel Inductor defined and every extern call it made is a row, nothing else
    defined: Counter[str] = Counter()
    externs = 0
    for source in (p.read_text() for p in mlp.generated):
        defined.update(_DEFINED.findall(source))
        externs += len(_EXTERN.findall(source.split("def call(", 1)[1].split("\ndef ", 1)[0]))
    assert Counter(r["Fusion Op"] for r in rows if not r["Fusion Op"].startswith("extern_")) == defined
    assert sum(r["Fusion Op"].startswith("extern_kernels.") for r in rows) == externs


def test_the_forward_graph_rows_name_the_fused_ops_and_the_models_bytes(mlp: Job) -> None:
    graphs = mlp.graphs()
    forward = next(g for g in graphs.values() if g.model_name == "MLP.forward#fwd0/0")
    path = mlp.device / "summary" / f"fusion_op_0_{forward.model_id}_1.csv"
    rows = [(r["Fusion Op"], r["Original Ops"]) for r in read_csv(path)]
    # linear -> relu -> add -> linear: the relu and the add (and the relu's mask the backward
    # needs) fuse into one C++ kernel between the two addmm calls
    fused_ops = "aten::add,aten::relu,aten::threshold_backward"
    assert rows == [("extern_kernels.addmm", "aten::t,aten::addmm"),
                    ("cpp_fused_add_relu_threshold_backward_0", fused_ops),
                    ("extern_kernels.addmm", "aten::t,aten::addmm")]
    first = read_csv(path)[0]
    # x is 16x32 float32; fc1 is 64x32 + 64; its output 16x64 (KB = 1024 bytes)
    assert first["Memory Input(KB)"] == f"{16 * 32 * 4 / 1024:.3f}"
    assert first["Memory Weight(KB)"] == f"{(64 * 32 + 64) * 4 / 1024:.3f}"
    assert first["Memory Output(KB)"] == f"{16 * 64 * 4 / 1024:.3f}"
    assert first["Memory Workspace(KB)"] == "N/A" and first["Memory Total(KB)"] == "N/A"
    fused = read_csv(path)[1]
    assert fused["Memory Workspace(KB)"] == "0.000"
    parts = [float(fused[k]) for k in HEADER[5:9]]
    assert float(fused["Memory Total(KB)"]) == pytest.approx(sum(parts), abs=0.002)


def test_model_identity_and_the_recompile(mlp: Job) -> None:
    graphs = mlp.graphs()
    names = sorted(g.model_name for g in graphs.values())
    assert names == ["MLP.forward#bwd0/0", "MLP.forward#bwd0/1", "MLP.forward#fwd0/0", "MLP.forward#fwd0/1"]
    assert len({g.model_id for g in graphs.values()}) == 4 and STEP_MODE_MODEL_ID not in graphs
    recompiled = [g for g in graphs.values() if g.compile_id == "0/1"]
    assert {g.first_iteration for g in recompiled} == {3}
    # the recompile made the batch dimension dynamic: byte counts over a symbol are N/A
    forward = next(g for g in recompiled if g.phase == "fwd")
    assert any(k.input_bytes is None for k in forward.kernels), forward.kernels
    counts = [CompileCountersRecord.from_raw(r) for s in raw(mlp.device).values()
              for r in s.get(CompileCountersRecord.STREAM, [])]
    assert counts and counts[-1] is not None and counts[-1].recompiles == 1 and counts[-1].graph_breaks == 0
    assert counts[-1].unique_graphs == 2


def test_the_operator_tier_carries_the_graphs_model_id_and_original_ops(mlp: Job) -> None:
    graphs = {g.model_name: g for g in mlp.graphs().values()}
    fwd, bwd = graphs["MLP.forward#fwd0/0"], graphs["MLP.forward#bwd0/0"]
    rows = read_csv(mlp.device / "summary" / f"op_summary_0_{STEP_MODE_MODEL_ID}_2.csv")
    eager = str(STEP_MODE_MODEL_ID)
    by_model = Counter((r["Model ID"], r["Op Name"]) for r in rows if r["Model ID"] != eager)
    assert by_model == {(str(fwd.model_id), "aten::addmm"): 2, (str(bwd.model_id), "aten::mm"): 3}
    events = json.loads((mlp.device / "timeline" / f"msprof_0_{STEP_MODE_MODEL_ID}_2.json").read_text())
    tagged = [e for e in events if isinstance(e, dict) and "Original Ops" in e.get("args", {})]
    assert {(e["args"]["Model Id"], e["args"]["Original Ops"]) for e in tagged} >= {
        (fwd.model_id, "aten::t,aten::addmm")}


def test_kernels_mode_times_each_cpp_kernel_and_changes_no_loss(mlp_kernels: Job, mlp_plain: Job,
                                                                 mlp: Job) -> None:
    assert mlp_kernels.losses == mlp_plain.losses == mlp.losses and len(mlp_plain.losses) == 4
    graphs = {g.model_name: g for g in mlp_kernels.graphs().values()}
    rows = read_csv(mlp_kernels.device / "summary" / f"op_summary_0_{STEP_MODE_MODEL_ID}_2.csv")
    fused = [(r["Model ID"], r["Op Name"], r["OP Type"]) for r in rows if r["OP Type"].startswith("Fused")]
    assert (str(graphs["MLP.forward#fwd0/0"].model_id), "cpp_fused_add_relu_threshold_backward_0",
            "Fused(add+relu+threshold_backward)") in fused
    assert all(float(r["Task Duration(us)"]) > 0 for r in rows if r["OP Type"].startswith("Fused"))
    summary = jobprof_cli("summary", "--json", str(mlp_kernels.runner.out))
    assert summary.returncode == 0, summary.stderr
    section = json.loads(summary.stdout)["sections"]["compiled_graphs"]
    table = [dict(zip(section["columns"], row, strict=True)) for row in section["rows"]]
    assert {r["model_name"] for r in table} == set(graphs)
    top = next(r for r in table if r["model_name"] == "MLP.forward#fwd0/0")
    expected = "cpp_fused_add_relu_threshold_backward_0 (add+relu+threshold_backward)"
    assert expected in top["top_kernels_what_they_fused"]
    assert top["task_ms_iter"] != "N/A"


def test_a_graph_break_gives_two_graphs_and_a_finding(tmp_path: Path) -> None:
    job = Job(tmp_path, "break", OPTIONS)
    forward = sorted(g.model_name for g in job.graphs().values() if g.phase == "fwd")
    assert len(forward) == 4 and forward[0].startswith("MLP.forward#fwd0/"), forward  # 2 graphs x recompile
    assert any(name.startswith("MLP.torch_dynamo_resume_in_forward_at_") for name in forward), forward
    summary = jobprof_cli("summary", "--json", str(job.runner.out))
    doc = json.loads(summary.stdout)
    breaks = [f for f in doc["findings"] if f["key"] == "compile_breaks"]
    assert breaks and breaks[0]["evidence"]["graph_breaks"] >= 1, doc["findings"]


def test_a_transformer_block(tmp_path: Path) -> None:
    job = Job(tmp_path, "block", OPTIONS)
    rows = [r for paths in job.fusion_files().values() for p in paths for r in read_csv(p)]
    assert len(rows) > 6
    generated = [r for r in rows if not r["Fusion Op"].startswith(("extern_kernels.", "torch.ops."))]
    assert generated and all(r["Original Ops"] != "N/A" for r in generated), generated
    assert any("layer_norm" in r["Original Ops"] for r in rows), rows


def test_the_parser_on_a_saved_cpu_wrapper_with_reuse_and_a_symbolic_shape() -> None:
    source = '''
cpp_fused_mul_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r\'\'\'
extern "C"  void  kernel(const float* in_ptr0, float* out_ptr0) {}
\'\'\')
cpp_fused_add_1 = async_compile.cpp_pybinding(['float*', 'const float*'], r\'\'\'
extern "C"  void  kernel(float* in_out_ptr0, const float* in_ptr0) {}
\'\'\')
def call(args):
    arg0_1, arg1_1 = args
    args.clear()
    buf0 = empty_strided_cpu((s0, 4), (4, 1), torch.float32)
    cpp_fused_mul_0(arg0_1, buf0)
    buf1 = empty_strided_cpu((8, 4), (4, 1), torch.float32)
    # Topologically Sorted Source Nodes: [mm], Original ATen: [aten.mm]
    extern_kernels.mm(arg1_1, reinterpret_tensor(arg1_1, (4, 8), (1, 4), 0), out=buf1)
    buf2 = buf1; del buf1  # reuse
    cpp_fused_add_1(buf2, arg1_1)
    return (buf2, )
def get_args():
    arg0_1 = rand_strided((s0, 4), (4, 1), device='cpu', dtype=torch.float32)
    arg1_1 = rand_strided((8, 4), (4, 1), device='cpu', dtype=torch.float16)
'''
    kernels = {k.name: k for k in wrapper.parse(source, static_inputs={1}, known_ops={"mul", "add", "mm"})}
    assert kernels["cpp_fused_mul_0"].original_ops == ["aten::mul"]
    assert kernels["cpp_fused_mul_0"].input_bytes is None  # s0
    mm = kernels["extern_kernels.mm"]
    assert mm.original_ops == ["aten::mm"] and mm.weight_bytes == 8 * 4 * 2 and mm.output_bytes == 8 * 4 * 4
    add = kernels["cpp_fused_add_1"]  # in-out buffer (the reused buf1) is read and written
    assert (add.input_bytes, add.output_bytes, add.weight_bytes) == (128, 128, 64)
    assert wrapper.ops_from_name("cpp_fused_add_relu_threshold_backward_0",
                                 {"add", "relu", "threshold", "threshold_backward"}) == \
        ["add", "relu", "threshold_backward"]
    assert wrapper.ops_from_name("cpp_fused_0", {"add"}) is None


def test_fusion_op_off_writes_nothing_and_task_trace_off_leaves_it_off(tmp_path: Path) -> None:
    runner = Runner(tmp_path)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    runner.run(PROGRAM, {**OPTIONS, "fusion_op": "off"}, args=["mlp"], env=env, timeout=300)
    summary = runner.device_dir() / "summary"
    assert not list(summary.glob("fusion_op_*")) and list(summary.glob("op_summary_*"))
    assert all(CompiledGraphRecord.STREAM not in s for s in raw(runner.device_dir()).values())


DDP_COMPILED = """
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
# DDP around the compiled module: torch 2.13 compiles nothing of torch.compile(DDP(m)) on CPU
# (Dynamo skips DDP's _inside_ddp_forward, so the module runs eagerly)
model = DDP(torch.compile(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
torch.manual_seed(dist.get_rank())
for step in range(4):
    opt.zero_grad()
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_compiled_ddp_job_gets_the_same_model_ids_on_both_ranks(tmp_path: Path) -> None:
    runner = Runner(tmp_path)
    launcher = torchrun(runner, runner.script(DDP_COMPILED, "ddp.py"), 2)
    runner.run(launcher, OPTIONS, timeout=400, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    prof = runner.prof_dirs()[0]
    ids = []
    for rank in (0, 1):
        files = sorted((prof / f"device_{rank}" / "summary").glob(f"fusion_op_{rank}_*_1.csv"))
        assert files, rank
        ids.append({p.stem.split("_")[3]: [(r["Model Name"], r["Fusion Op"], r["Original Ops"])
                                           for r in read_csv(p)] for p in files})
    assert ids[0] == ids[1] and len(ids[0]) >= 2, ids
