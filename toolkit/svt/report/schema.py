"""The report.json layout version: `svt compare` refuses reports of another schema."""

REPORT_SCHEMA = 1
