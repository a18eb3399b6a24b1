"""The instructor's hidden cases: further checks, run after the public ones, that a student build never ships.

``hidden/chXX.py`` defines a function named like the public checker in ``checks/chXX.py`` (``check_block_pool``)
and takes the same ``Tester``. ``make student`` leaves this package out, so a student's own ``check`` runs only
the public cases (feedback), while ``python -m minfer.exercises.grade`` -- run from the instructor's full
checkout -- runs both against the student's code. Cases that need the reference solution (a schedule compared
step by step with the reference's, properties checked against it) live here: a student build carries no
reference.
"""
