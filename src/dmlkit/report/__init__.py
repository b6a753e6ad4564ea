"""Self-contained HTML run reports and run comparisons (figures embedded as base64 PNG).

``write_report(run_dir)`` writes ``run_dir/report.html``; ``write_comparison(run_dirs, out_path)``
writes one page comparing several runs; the ``WriteReport`` callback writes the report at the
end of training. Both only read the run directory the engine wrote.
"""

from dmlkit.report.callback import WriteReport
from dmlkit.report.comparison import build_comparison_html, write_comparison
from dmlkit.report.run_reader import MissingRunFileError, RunData, TestEmbeddings, load_run
from dmlkit.report.run_report import REPORT_FILE, build_report_html, write_report

__all__ = [
    "REPORT_FILE",
    "MissingRunFileError",
    "RunData",
    "TestEmbeddings",
    "WriteReport",
    "build_comparison_html",
    "build_report_html",
    "load_run",
    "write_comparison",
    "write_report",
]
