"""The search core of `fleet tune`: what the evaluators (replay, cloud trials) and the CLI depend
on, depending on none of them.

- `evaluation`: the types a trial's result travels in (Evaluation, Evaluator).
- `engines`: one suggestion algorithm per module behind one interface (`Engine`: ask, tell),
  found by name in `engines.ALGORITHMS`; adding one is a file and a line there.
- `features`: configurations as numbers a model can learn from (an instance type's class,
  generation, processor and size; ordered values as numbers).
- `recommend`: the configuration to use, estimated through the noise, with an interval.
- `racing`: the last share of a budget spent on replicates of the finalists, for any engine.
- `record`: what a search's record in the results database says (best, recommendation, spend).

Outside itself it reads only the space (`fleet.space`), the price catalog (`fleet.prices`), the
results database (`fleet.results`) and amibake's errors; tests/test_layers.py holds it to that.
"""
