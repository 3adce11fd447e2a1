"""u3m report: plots and a self-contained HTML report from u3m's JSON results.

`u3m report RESULT.json [more.json] -o report.html` runs `python3 -m u3m_report`.
It knows the JSON of `train capacity`, `serve capacity`, `predict eval`,
`plan cost` and Chrome trace-event timelines (`--timeline`); each figure
carries the label its result gives: simulated (profile, model), measured (on
which machine) or computed from a trace. docs/report.md describes it.
"""
