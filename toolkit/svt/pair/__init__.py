"""The built-in pair measured as a speculative pair and against its issue goals: it runs collections
and loads models, so it sits above both (svt.models trains the pair; svt.report reads stored results)."""
