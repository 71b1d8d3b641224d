"""The transforms: scaffold (placeholders), apply (generated wiring), revert (back to placeholders).

Each plans its edits of one file as an `EditPlan` (plan.py, no libcst); edits.py applies a plan
to the file's libcst tree, and imports.py places and removes imports as isort would. libcst is
imported only when a plan has work to do, so `check` never loads it.
"""
