"""Ready-made environments and tasks for multi-turn rollouts (``model.sampling.multi_turn``), the agent demonstrations':

- :mod:`~lit_entropy.environments.calculator`: two-operand arithmetic with a ``calculate`` tool (a tool
  environment, TRL's ``environment_factory`` duck type);
- :mod:`~lit_entropy.environments.guessing_game`: higher/lower (a gym-like text environment);
- :mod:`~lit_entropy.environments.char_chat`: the character chat tokenizer of their tiny models.

Import the modules themselves (``lit_entropy.environments.calculator:CalculatorEnvironment`` in a config).
"""
