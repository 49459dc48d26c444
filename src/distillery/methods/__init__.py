"""The methods' specs: each module's ``Options`` (a :class:`~distillery.method.MethodOptions`) and the
``<name>.yaml`` beside it (budgets and presets). Data only, no torch: the command line reads them."""
