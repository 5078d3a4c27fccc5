"""Error types that the CLI turns into one-line messages and exit code 2."""


class SimdistError(Exception):
    """Base class: anything a user can cause and should read as one line."""


class ScenarioError(SimdistError):
    """A scenario (file or dict) is malformed or contradictory; the message names the field."""


class HostError(SimdistError):
    """The machine cannot host what was asked (e.g. world size, CUDA devices)."""


class InputError(SimdistError):
    """An argument (a command-line option, or the same argument of an API call) is out of
    range; the message names it."""


class LimitError(SimdistError):
    """The input asks for more work or memory than a stated resource limit allows
    (`simdist.limits`); the message names the limit and how to raise it."""


class ScriptError(SimdistError):
    """A user's script cannot be run on simulated ranks (missing, does not parse, never
    initialises a process group, ...); the message says which and why."""


class DumpError(SimdistError):
    """A Flight Recorder dump (or a file given as one) cannot be read: truncated, foreign, of
    an unknown format version, or a pickle that asks to run code; the message names the file."""
