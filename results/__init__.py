"""lrt_results: the study statistics, report tables, figures and page generators built on lrt_lab.

lrt_lab is the instrument: it runs models and reads and writes runs. This package is the lab
notebook: what a run store's runs say together (seed intervals, contrasts, studies, scaling fits,
the gap tables), the tables `lrt-lab report` prints, the figures, and the pages
experiments/results_tables.py and experiments/scaling_tables.py generate. It imports lrt_lab and
never torch (the import contracts); lrt_lab never imports it by name, and reaches `lrt-lab report`
and the statistics its analyses need through the entry point group lrt_lab.commands
(lrt_lab.core.plugins.provided). docs/design.md, "The instrument and the lab", says why.
"""
