"""``python -m rmsnorm_lab``: the workbook's command line (report, bench, profile, nsys-summary).

The commands measure and render; they come with the workbook (``rmsnorm_workbook``, installed by
the README's set-up), not with the library, which has none of its own. This entry point is not
part of the library's import graph: nothing imports it.

An ``RMSNORM_LAB_*`` variable with a value its toggle cannot take is reported (one line, exit
status 2) by ``settings.py`` as the package is imported: Python imports ``rmsnorm_lab`` before it
runs this file, so nothing here could catch it.
"""

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    try:
        from rmsnorm_workbook.__main__ import main as workbook_main
    except ModuleNotFoundError as e:
        if e.name != "rmsnorm_workbook":
            raise
        if list(sys.argv[1:] if argv is None else argv) == ["--version"]:
            from rmsnorm_lab import __version__
            print(f"rmsnorm_lab {__version__}")
            return 0
        print("error: the command line comes with the workbook, which is not installed here: "
              "from a checkout of rmsnorm-lab, `bash install.sh` (or `pip install -e workbook`)",
              file=sys.stderr)
        return 2
    return workbook_main(argv)


if __name__ == "__main__":
    sys.exit(main())
