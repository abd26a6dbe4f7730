"""What the hub keeps: state files, the audit log, the task pool, the gate and the model state,
on files or on one shared Redis (docs/architecture.md §1 and §9 list the modules and files).
"""
