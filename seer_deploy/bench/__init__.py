"""`seer-deploy bench`: the rows (rows.py), timing (measure.py), the run (harness.py), the cost-scaling workload
(scaling.py), the machine (machine.py), the record (results.py) and its renderings (report.py, plot.py)."""
