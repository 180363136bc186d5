"""Reading what Nsight Systems reports on a lab workload (profiling/workload.py captures one).

``nsys-summary`` (``python -m rmsnorm_lab nsys-summary``) runs ``nsys stats --report
nvtx_sum,cuda_gpu_kern_sum,nvtx_kern_sum --format csv`` on a report (nsys writes one CSV per
report, ``<prefix>_<report>.csv``), or reads such CSVs from a folder, and prints per range of the
``rmsnorm_lab`` domain: instances, wall time on the host (from ``nvtx_sum``), the time of the
kernels launched inside the range (``nvtx_kern_sum``), and their difference per instance.

How to read the difference. An NVTX range is host time (push to pop); a kernel is device time.
``nvtx_kern_sum`` gives a range the kernels *launched* inside it (on the same thread), also when
they run after the range has closed. So ``wall − kernels`` per instance is the host cost beyond
the kernel's duration: for a ``launch`` range, launch overhead when the GPU keeps up. It is negative
when the kernels take longer than it takes to enqueue them (the GPU is the bottleneck). A kernel
belongs to every range on the stack when it was launched, so ``iter`` counts the kernels of the
ranges inside it. With ``--op full`` the backward runs on autograd's device thread: its kernels
and ranges are not inside ``iter`` (a different thread), so the capture's total kernel time
(``cuda_gpu_kern_sum``, printed under the table) is the per-iteration device time to compare with.

The parsers are pure functions of a CSV file and are tested on the CPU with CSVs in nsys's format
(tests/workbook/data/nsys/).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re
import shlex
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from rmsnorm_lab.lab import NVTX_DOMAIN as DOMAIN

#: the ``nsys stats`` reports this module reads (nsys 2023.x to 2025.x spell them so)
NSYS_REPORTS = ("nvtx_sum", "cuda_gpu_kern_sum", "nvtx_kern_sum")
#: the first word of every range the lab opens: common/nvtx.py's stages and this module's own
STAGES = ("iter", "replay", "warmup", "compile", "marshal", "launch", "reduce")

#: how ``profile`` must be started under nsys; {out} and {args} are filled in
NSYS_PROFILE = ("nsys profile -t cuda,nvtx --cuda-graph-trace=node "
                "--capture-range=cudaProfilerApi --capture-range-end=stop --force-overwrite true "
                "-o {out} "
                "python3 -m rmsnorm_lab profile{args}")
NSYS_MISSING = ("nsys (the Nsight Systems command line) is not on PATH. Install Nsight Systems "
                "(https://developer.nvidia.com/nsight-systems; also shipped with the CUDA toolkit "
                "under nsight-systems-<version>/bin) and put its bin/ on PATH, or export the CSVs "
                "where nsys is installed and read them here with --csv-dir DIR.")


class ProfileError(Exception):
    """The workload cannot run as asked (no autograd for the backend, shape not eligible...)."""


class NsysError(Exception):
    """nsys is missing, failed, or its CSVs are missing or malformed."""


class NsysMissing(NsysError):
    pass


# ============================================================================ parsing CSVs

@dataclasses.dataclass(frozen=True)
class RangeTime:
    """One row of ``nvtx_sum``: host wall time of an NVTX range (ns)."""
    range: str  # as nsys wrote it, e.g. "rmsnorm_lab:launch row 128x4096"
    style: str
    instances: int
    total_ns: float
    avg_ns: float
    med_ns: float
    min_ns: float
    max_ns: float


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """One row of ``cuda_gpu_kern_sum``: device time of one kernel (ns)."""
    name: str
    instances: int
    total_ns: float
    avg_ns: float
    med_ns: float
    min_ns: float
    max_ns: float


@dataclasses.dataclass(frozen=True)
class RangeKernel:
    """One row of ``nvtx_kern_sum``: the instances of one kernel launched inside one range, on
    one thread (``nvtx_instances`` counts the range instances that launched it)."""
    range: str
    style: str
    pid: int
    tid: int
    nvtx_instances: int
    kernel_instances: int
    total_ns: float
    avg_ns: float
    kernel: str


#: the units nsys writes in its column headers ("Total Time (ns)", "Start (us)"), in ns
UNIT_NS = {"ns": 1.0, "us": 1e3, "μs": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}
_UNIT_RE = re.compile(r"\s*\((ns|us|μs|µs|ms|s|%)\)\s*$")


def _read_table(path: Path, required: Sequence[str]) -> Tuple[List[str], List[List[str]]]:
    """The header and data rows of a CSV written by nsys stats. Lines before the header (the
    status lines nsys prints when writing to stdout) are skipped: the header is the first line
    that has every base name in ``required`` (a column ``Total Time (us)`` has the base name
    ``Total Time``)."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    rows = list(csv.reader(io.StringIO(text)))
    for i, row in enumerate(rows):
        bases = {base_name(c) for c in row}
        if all(r in bases for r in required):
            data = [r for r in rows[i + 1:] if any(c.strip() for c in r)]
            return [c.strip() for c in row], data
    raise NsysError(f"{path}: no header with the columns {list(required)}; is this the CSV of "
                    "the right nsys stats report?")


def base_name(column: str) -> str:
    """A column name without its unit: ``"Total Time (ns)"`` -> ``"Total Time"``."""
    return _UNIT_RE.sub("", column.strip())


def column_ns(column: str) -> float:
    """ns per unit of a time column's values (1 without a unit: nsys's default)."""
    m = _UNIT_RE.search(column)
    return UNIT_NS.get(m.group(1), 1.0) if m else 1.0


class _Row:
    """Named access to one CSV row; times come back in ns whatever unit the header names."""

    def __init__(self, path: Path, lineno: int, header: List[str], cells: List[str]):
        self.path, self.lineno, self.cells = path, lineno, cells
        self.index = {}
        for i, col in enumerate(header):
            self.index.setdefault(base_name(col), (i, col))

    def has(self, name: str) -> bool:
        return name in self.index

    def text(self, *names: str) -> str:
        for name in names:
            if name in self.index:
                i, _ = self.index[name]
                return self.cells[i].strip() if i < len(self.cells) else ""
        raise NsysError(f"{self.path}: no column {' or '.join(map(repr, names))}")

    def number(self, name: str) -> float:
        raw = self.text(name).replace(",", "")
        try:
            value = float(raw) if raw else 0.0
        except ValueError:
            raise NsysError(f"{self.path}:{self.lineno}: column {name!r} is not a number: "
                            f"{raw!r}") from None
        return value

    def count(self, name: str) -> int:
        return int(round(self.number(name)))

    def ns(self, name: str) -> float:
        return self.number(name) * column_ns(self.index[name][1])


def _rows(path, required):
    header, data = _read_table(Path(path), required)
    # data line numbers are approximate when nsys status lines precede the header; fine for errors
    return [_Row(Path(path), n + 2, header, cells) for n, cells in enumerate(data)]


def parse_nvtx_sum(path) -> List[RangeTime]:
    """``nvtx_sum`` CSV → one ``RangeTime`` per row (every domain; see ``normalize_range``)."""
    out = []
    for r in _rows(path, ("Total Time", "Instances", "Avg", "Med", "Min", "Max")):
        out.append(RangeTime(range=r.text("Range", "NVTX Range", "Name"),
                             style=r.text("Style") if r.has("Style") else "",
                             instances=r.count("Instances"), total_ns=r.ns("Total Time"),
                             avg_ns=r.ns("Avg"), med_ns=r.ns("Med"), min_ns=r.ns("Min"),
                             max_ns=r.ns("Max")))
    return out


def parse_kern_sum(path) -> List[KernelTime]:
    """``cuda_gpu_kern_sum`` CSV → one ``KernelTime`` per kernel."""
    return [KernelTime(name=r.text("Name", "Kernel Name"), instances=r.count("Instances"),
                       total_ns=r.ns("Total Time"), avg_ns=r.ns("Avg"), med_ns=r.ns("Med"),
                       min_ns=r.ns("Min"), max_ns=r.ns("Max"))
            for r in _rows(path, ("Total Time", "Instances", "Avg", "Name"))]


def parse_nvtx_kern_sum(path) -> List[RangeKernel]:
    """``nvtx_kern_sum`` CSV → one ``RangeKernel`` per (range, thread, kernel) row."""
    out = []
    for r in _rows(path, ("NVTX Range", "NVTX Inst", "Kern Inst", "Total Time", "Kernel Name")):
        out.append(RangeKernel(range=r.text("NVTX Range"),
                               style=r.text("Style") if r.has("Style") else "",
                               pid=r.count("PID") if r.has("PID") else 0,
                               tid=r.count("TID") if r.has("TID") else 0,
                               nvtx_instances=r.count("NVTX Inst"),
                               kernel_instances=r.count("Kern Inst"),
                               total_ns=r.ns("Total Time"),
                               avg_ns=r.ns("Avg") if r.has("Avg") else 0.0,
                               kernel=r.text("Kernel Name")))
    return out


def normalize_range(name: str, domain: str = DOMAIN) -> Optional[str]:
    """The lab's name of a range as nsys prints it, or None for a range of another domain.

    nsys writes a range as ``<domain>:<text>``: ``rmsnorm_lab:launch row 128x4096``; some versions
    and reports leave the domain out (``:launch row 128x4096`` or ``launch row 128x4096``). Those
    are taken as the lab's when their first word is one of its stages (``STAGES``)."""
    name = name.strip()
    if name.startswith(domain + ":"):
        return name[len(domain) + 1:].strip()
    head, sep, rest = name.partition(":")
    if sep and head:  # another domain (cuBLAS:..., NCCL:...) or a name like aten::add
        return None
    text = rest.strip() if sep else name
    return text if text.split(" ", 1)[0] in STAGES else None


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """One range of the lab: wall time (host) and the kernels it launched (device), in ns."""
    range: str
    instances: int
    wall_total_ns: Optional[float]
    wall_avg_ns: Optional[float]
    kernel_instances: int
    kernel_total_ns: float
    kernels: Tuple[str, ...]

    @property
    def kernels_per_instance(self) -> float:
        return self.kernel_instances / self.instances if self.instances else 0.0

    @property
    def kernel_avg_ns(self) -> float:
        """Kernel time per range instance (all the range's kernels together)."""
        return self.kernel_total_ns / self.instances if self.instances else 0.0

    @property
    def overhead_ns(self) -> Optional[float]:
        """Wall time per instance minus kernel time per instance (see the module's notes)."""
        return None if self.wall_avg_ns is None else self.wall_avg_ns - self.kernel_avg_ns


def _order(name: str) -> Tuple[int, str]:
    stage = name.split(" ", 1)[0]
    return (STAGES.index(stage) if stage in STAGES else len(STAGES), name)


def summarize(ranges: Iterable[RangeTime], range_kernels: Iterable[RangeKernel],
              domain: str = DOMAIN) -> List[SummaryRow]:
    """Join ``nvtx_sum`` and ``nvtx_kern_sum`` rows per range of ``domain`` (names normalized;
    rows of the same range on several threads or styles are added up). Ranges that launched no
    kernel have kernel time 0. Sorted by stage (iter, warmup, compile, marshal, launch, reduce),
    then name."""
    wall: Dict[str, List[float]] = {}
    for r in ranges:
        name = normalize_range(r.range, domain)
        if name is None:
            continue
        acc = wall.setdefault(name, [0, 0.0])
        acc[0] += r.instances
        acc[1] += r.total_ns
    kern: Dict[str, list] = {}
    for k in range_kernels:
        name = normalize_range(k.range, domain)
        if name is None:
            continue
        acc = kern.setdefault(name, [0, 0.0, [], 0])
        acc[0] += k.kernel_instances
        acc[1] += k.total_ns
        if k.kernel not in acc[2]:
            acc[2].append(k.kernel)
        acc[3] = max(acc[3], k.nvtx_instances)
    out = []
    for name in sorted(set(wall) | set(kern), key=_order):
        n_kern, t_kern, names, nvtx_inst = kern.get(name, (0, 0.0, [], 0))
        if name in wall:
            inst, total = wall[name]
            out.append(SummaryRow(name, int(inst), total, total / inst if inst else 0.0,
                                  n_kern, t_kern, tuple(names)))
        else:  # kernels without a wall row: nvtx_sum and nvtx_kern_sum disagree; show what is
            out.append(SummaryRow(name, nvtx_inst, None, None, n_kern, t_kern, tuple(names)))
    return out


def format_table(rows: Sequence[SummaryRow]) -> str:
    """A fixed-width table in µs (what ``nsys-summary`` prints)."""
    head = ("range", "inst", "wall total", "wall avg", "kern/inst", "kern total", "kern avg",
            "wall-kern")
    units = ("", "", "µs", "µs", "", "µs", "µs/inst", "µs/inst")

    def us(v):
        return "-" if v is None else f"{v / 1e3:,.2f}"

    body = [(r.range, str(r.instances), us(r.wall_total_ns), us(r.wall_avg_ns),
             f"{r.kernels_per_instance:.2f}", us(r.kernel_total_ns), us(r.kernel_avg_ns),
             us(r.overhead_ns)) for r in rows]
    widths = [max(len(h), len(u), *(len(b[i]) for b in body)) if body else max(len(h), len(u))
              for i, (h, u) in enumerate(zip(head, units))]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), line(units), rule, *(line(b) for b in body)])


def format_kernels(kernels: Sequence[KernelTime], iters: Optional[int] = None,
                   width: int = 72) -> str:
    """The capture's kernels (``cuda_gpu_kern_sum``) and their total, per ``iter`` when given."""
    lines = []
    for k in sorted(kernels, key=lambda k: -k.total_ns):
        name = k.name if len(k.name) <= width else k.name[:width - 1] + "…"
        lines.append(f"  {k.instances:>7}  {k.total_ns / 1e3:>12,.2f} µs  "
                     f"avg {k.avg_ns / 1e3:>9,.2f} µs  med {k.med_ns / 1e3:>9,.2f} µs  {name}")
    total = sum(k.total_ns for k in kernels)
    count = sum(k.instances for k in kernels)
    tail = f"all kernels in the capture: {count} launches, {total / 1e3:,.2f} µs"
    if iters:
        tail += f" = {total / iters / 1e3:,.2f} µs per iter ({count / iters:.2f} launches)"
    return "\n".join(["kernels (cuda_gpu_kern_sum):", *lines, tail])


# ============================================================================ running nsys

def find_csvs(folder, stem: Optional[str] = None) -> Dict[str, Path]:
    """The CSV of each of ``NSYS_REPORTS`` in ``folder``: ``<stem>_<report>.csv`` (how
    ``nsys stats --output <stem>`` names them), or ``<report>.csv``. Without ``stem`` exactly one
    candidate per report must exist."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NsysError(f"--csv-dir {folder}: not a folder")
    found = {}
    for report in NSYS_REPORTS:
        if stem is not None:
            cands = [folder / f"{stem}_{report}.csv"]
        else:
            cands = sorted(folder.glob(f"*_{report}.csv")) + [folder / f"{report}.csv"]
        # "x_nvtx_kern_sum.csv" also ends in "_kern_sum.csv", never in "_nvtx_sum.csv": the
        # report names are not suffixes of one another, so a glob never takes a sibling's file
        cands = [c for c in cands if c.is_file()]
        if not cands:
            want = f"{stem}_{report}.csv" if stem else f"*_{report}.csv"
            raise NsysError(f"{folder}: no {want} (the nsys stats report {report!r})")
        if len(cands) > 1:
            raise NsysError(f"{folder}: several {report} CSVs ({', '.join(c.name for c in cands)})"
                            "; name the report (nsys-summary NAME.nsys-rep --csv-dir DIR) to "
                            "pick those of NAME")
        found[report] = cands[0]
    return found


def nsys_stats_command(report, prefix, nsys: str = "nsys") -> List[str]:
    return [nsys, "stats", "--report", ",".join(NSYS_REPORTS), "--format", "csv",
            "--output", str(prefix), "--force-export", "true", "--force-overwrite", "true",
            str(report)]


def run_nsys_stats(report, out_dir=None) -> Dict[str, Path]:
    """Export the three reports of ``report`` (a .nsys-rep) as CSVs into ``out_dir`` (default:
    beside the report) and return their paths."""
    report = Path(report)
    nsys = shutil.which("nsys")
    if nsys is None:
        raise NsysMissing(NSYS_MISSING)
    if not report.is_file():
        raise NsysError(f"{report}: no such report file")
    stem = report.name[:-len(".nsys-rep")] if report.name.endswith(".nsys-rep") else report.stem
    out_dir = Path(out_dir) if out_dir is not None else report.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = nsys_stats_command(report, out_dir / stem, nsys)
    print("$ " + shlex.join(["nsys", *cmd[1:]]), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise NsysError(f"nsys stats exited with {done.returncode}:\n{done.stderr or done.stdout}")
    try:
        return find_csvs(out_dir, stem)
    except NsysError as e:
        raise NsysError(f"{e}\nnsys stats said:\n{done.stdout}{done.stderr}") from None


def summary_text(csvs: Dict[str, Path], domain: str = DOMAIN) -> str:
    rows = summarize(parse_nvtx_sum(csvs["nvtx_sum"]), parse_nvtx_kern_sum(csvs["nvtx_kern_sum"]),
                     domain)
    kernels = parse_kern_sum(csvs["cuda_gpu_kern_sum"])
    if not rows:
        return (f"no ranges of the {domain!r} domain in {csvs['nvtx_sum']}: was the capture made "
                "with -t cuda,nvtx around `python -m rmsnorm_lab profile` (which turns "
                "settings.nvtx on)?\n\n" + format_kernels(kernels))
    iters = next((r.instances for r in rows if r.range == "iter"), None)
    notes = ("wall: host time of the range (nvtx_sum); kern: device time of the kernels launched "
             "inside it (nvtx_kern_sum), per range instance; wall-kern < 0 means the GPU, not "
             "the host, sets the pace. `iter` holds every range inside it; with --op full the "
             "backward runs on autograd's thread, outside `iter`: compare with the capture's "
             "total below.")
    return "\n\n".join([format_table(rows), textwrap.fill(notes, 100),
                        format_kernels(kernels, iters)])
