__xla_gitrev__ = "stand-in"
