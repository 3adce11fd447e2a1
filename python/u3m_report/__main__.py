"""python3 -m u3m_report RESULT.json [more.json] -o report.html [--summary]

Bad input (a file that is not one of u3m's results, or is missing a field it
uses), and a missing matplotlib, end in one line "u3m: error: ..." and exit 2.
"""
import argparse
import os
import sys

from . import results


def fail(msg):
    print(f"u3m: error: {msg}", file=sys.stderr)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as the rest of the CLI
        fail(f"{message} (see 'u3m report --help')")


def main(argv=None):
    ap = _Parser(prog="u3m report", description="Plots and an HTML report from u3m results")
    ap.add_argument("results", nargs="+", metavar="RESULT.json")
    ap.add_argument("-o", "--output", help="HTML file to write (images embedded)")
    ap.add_argument("--summary", action="store_true", help="Print a few lines per result")
    a = ap.parse_args(argv)
    if not a.output and not a.summary:
        fail("give -o REPORT.html, --summary, or both")
    try:
        loaded = [(p,) + results.load(p) for p in a.results]
    except results.ReportError as e:
        fail(str(e))
    try:
        from . import render
        if a.output:
            render._mpl()
    except ImportError as e:
        fail(f"u3m report needs matplotlib for {sys.executable} (Debian: apt-get install "
             f"python3-matplotlib): {e}")
    if a.summary:
        for _, kind, data in loaded:
            for line in render.summary(kind, data):
                print(line)
    if a.output:
        sections = []
        for _, kind, data in loaded:
            sections += render.FIGURES[kind](data)
        if not sections:
            fail("nothing to plot in " + ", ".join(a.results))
        text = render.page(sections, [p for p, _, _ in loaded])
        tmp = a.output + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, a.output)
        except OSError as e:
            fail(f"-o {a.output}: cannot write ({e.strerror})")
        print(f"report: {os.path.abspath(a.output)} ({len(sections)} figures)")


if __name__ == "__main__":
    main()
