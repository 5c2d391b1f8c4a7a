"""What a campaign means: load its tables, compute crash rates, survival, latency, cost and verdicts, and
write the report.

    results.load_results(dir)      -> CampaignResults (tidy DataFrames; the one load path)
    stats.*, survival.*, attribution.attribute, verdict.verdicts   -> per-configuration DataFrames
    report.write_report(dir, ...)  -> report.md + PNGs + one self-contained report.html (sections_*.py)

Submodules are not imported here: ``import mmchaos.analysis`` stays cheap (matplotlib loads only for a report).
"""
