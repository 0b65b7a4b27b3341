"""What the absl programs share: flags generated from the config dataclasses, and
one-line errors.

`define_flags(ModelConfig, ...)` defines one flag per dataclass field, with
the field's type, its default (or None: "the preset decides") and the help
text of its docstring's `Attributes:` entry, so defaults and help live in
the dataclass only. `from_flags` builds the dataclass back from the parsed
flags and reports an invalid value as `--flag=value: reason`.
`run(main)` runs a program: a user error (a bad flag value, a missing or
malformed file, a directory it must not replace) ends with one line on
stderr and exit code 2 (flags) or 1 (everything else); `--debug` shows the
traceback. Programs call `flags.adopt_module_key_flags(dare_tf.cli)` so
that `--help` lists the generated flags.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import sys
from typing import Any, Callable

from absl import app, flags, logging

FLAGS = flags.FLAGS

flags.DEFINE_bool("debug", False, "Show the Python traceback of an error.")


def field_docs(cls) -> dict[str, str]:
    """Field name -> its description in the class docstring's `Attributes:` section
    (`name (qualifier): text` gives `(qualifier) text`)."""
    docs, current = {}, None
    section = (cls.__doc__ or "").split("Attributes:", 1)
    if len(section) < 2:
        return docs
    for line in section[1].splitlines():
        match = re.match(r"^ {8}(\w[\w, ]*?)(?: \(([^)]*)\))?:\s*(.*)$", line)
        if match:
            current = [n.strip() for n in match.group(1).split(",")]
            for name in current:
                docs[name] = (f"({match.group(2)}) " if match.group(2) else "") + match.group(3).strip()
        elif current and line.startswith(" " * 12):
            for name in current:
                docs[name] += " " + line.strip()
        elif line.strip() and not line.startswith(" " * 12):
            current = None
    return docs


def define_flags(cls, *, exclude=(), rename: dict[str, str] | None = None, choices: dict | None = None,
                 preset_defaults: bool = False) -> list[str]:
    """Defines a flag per field of dataclass `cls`; returns the flag names.

    `preset_defaults`: every flag defaults to None, meaning "not set here" (a
    preset or another layer decides); the help names the dataclass default.
    """
    rename, choices = rename or {}, choices or {}
    docs = field_docs(cls)
    names = []
    for field in dataclasses.fields(cls):
        if field.name in exclude:
            continue
        name = rename.get(field.name, field.name)
        default = field.default if field.default is not dataclasses.MISSING else None
        kind = str(field.type).replace(" ", "")
        help_text = docs.get(field.name, f"{cls.__name__}.{field.name}")
        if preset_defaults:
            help_text += f" [preset's value; {cls.__name__} default: {default!r}]"
            default = None
        kwargs = {}
        if field.name in choices:
            flags.DEFINE_enum(name, default, list(choices[field.name]), help_text, **kwargs)
        elif kind.startswith("tuple["):
            flags.DEFINE_list(name, None if default is None else [str(v) for v in default], help_text, **kwargs)
        elif kind in ("int", "int|None"):
            flags.DEFINE_integer(name, default, help_text, **kwargs)
        elif kind in ("float", "float|None"):
            flags.DEFINE_float(name, default, help_text, **kwargs)
        elif kind == "bool":
            flags.DEFINE_bool(name, default, help_text, **kwargs)
        elif kind in ("str", "str|None"):
            flags.DEFINE_string(name, default, help_text, **kwargs)
        else:
            continue  # not expressible as a flag (dicts)
        names.append(name)
    return names


def flag_values(cls, *, exclude=(), rename: dict[str, str] | None = None,
                only_set: bool = False) -> dict[str, Any]:
    """Field name -> value of its flag (`only_set`: only flags not None)."""
    rename = rename or {}
    out = {}
    for field in dataclasses.fields(cls):
        name = rename.get(field.name, field.name)
        if field.name in exclude or name not in FLAGS:
            continue
        value = FLAGS[name].value
        if value is None and only_set:
            continue
        if isinstance(value, list):
            try:
                value = tuple(int(v) for v in value)
            except ValueError:
                raise app.UsageError(f"--{name}={','.join(value)}: expected comma-separated integers") from None
        out[field.name] = value
    return out


def from_flags(cls, *, rename: dict[str, str] | None = None, **fields):
    """`cls(**flag values, **fields)`; an invalid value is reported with its flag's name."""
    values = dict(flag_values(cls, exclude=tuple(fields), rename=rename), **fields)
    try:
        return cls(**values)
    except ValueError as e:
        raise app.UsageError(flag_message(str(e), rename)) from e


def flag_message(message: str, rename: dict[str, str] | None = None) -> str:
    """`ModelConfig.top_k: ...` or `top_k=0: ...` -> `--top_k...` (the flag's name)."""
    rename = rename or {}
    match = re.match(r"^(?:\w+Config\.|Protocol\.)?(\w+)(=|:)", message)
    if match and match.group(1) in {f for f in FLAGS} | set(rename):
        name = rename.get(match.group(1), match.group(1))
        return f"--{name}{message[match.end(1):]}"
    return message


def program_flags_text(exclude: tuple[str, ...] = ("debug", "overwrite")) -> str:
    """The program's own flags (its module's and those it adopted, not absl's), one
    `--name=value` line each: a flagfile that reruns the program
    (`--flagfile=RUN/flags.txt`). One-time actions (`--overwrite`) are left out."""
    module = sys.argv[0] if FLAGS.get_key_flags_for_module(sys.argv[0]) else sys.modules["__main__"]
    lines = [flag.serialize() for flag in FLAGS.get_key_flags_for_module(module)
             if flag.name not in exclude and flag.value is not None]
    return "\n".join(sorted(line for line in lines if line)) + "\n"


def int64_flag(name: str, value: str) -> int:
    """A flag's value as a raw int64 id (`--user_id=...`), refused in one line otherwise."""
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"--{name}={value}: a raw id is an integer") from None
    if not -(2**63) <= number < 2**63:
        raise ValueError(f"--{name}={value}: does not fit int64")
    return number


def run(main: Callable[..., Any], configure: Callable[[list[str]], Any] | None = None,
        tensorflow: bool | Callable[[Any], bool] = True, keras2: bool | Callable[[Any], bool] = False,
        models: bool = True) -> None:
    """`app.run(main)`, with user errors as one line on stderr and exit code 1.

    Once the flags are parsed, `configure(argv)` (when given) builds the
    program's configuration from the flags and the command line's positional
    arguments (and checks its input files), so that a bad value is refused
    before TensorFlow loads; then (`tensorflow=True`) TensorFlow loads quietly
    (TF_CPP_MIN_LOG_LEVEL 2 unless set, its start-up notices filtered, every
    layer, search and optimizer registered: `dare_tf.load`) and `main(argv)`, or
    `main(configuration)`, runs. A program of the retrieval stage passes
    `keras2=True` (`tf.keras` as Keras 2 for tensorflow-recommenders:
    `dare_tf.retrieval.use_keras2`), or a function of the configuration (the
    export: only a retrieval run's); one without TensorFlow (data preparation:
    numpy and pyarrow) passes `tensorflow=False`, or a function of the configuration
    (the history service: only `load` reads TFRecords); one that talks to servers
    and stores but builds no model passes `models=False`: no Keras model code."""

    def guarded(argv):
        try:
            if not FLAGS["verbosity"].present:  # quiet by default: absl INFO only when --verbosity asks
                logging.set_verbosity(logging.WARNING)
            configuration = configure(argv) if configure else None
            # No TensorFlow C++ INFO or WARNING lines, also where a program of numpy alone reads
            # TFRecord shards (data.prepare --append: dare_tf.data.storage.records imports TensorFlow quietly).
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            from dare_tf._startup import (FilteredStderr, configured_backend, reuse_freed_memory, start_up_frozen,
                                          without_unused_imports)

            reuse_freed_memory()
            if not (tensorflow(configuration) if callable(tensorflow) else tensorflow):
                with start_up_frozen():
                    return main(configuration) if configure else main(argv)
            import dare_tf
            from dare_tf.retrieval._keras2 import use_keras2

            if keras2(configuration) if callable(keras2) else keras2:
                use_keras2()  # before TensorFlow loads (Keras 3, `import keras`, is unaffected)
            with FilteredStderr():  # TensorFlow's notices while the program runs, filtered
                with without_unused_imports(configured_backend()):
                    if models:
                        dare_tf.load()  # the flags are parsed: now TensorFlow, Keras and every model module
                    else:
                        importlib.import_module("tensorflow")  # (its protos and SavedModels; no Keras)
                with start_up_frozen():  # (the imports out of the garbage collector's sight)
                    return main(configuration) if configure else main(argv)
        except KeyboardInterrupt:
            raise
        except ModuleNotFoundError as e:  # (a requirement missing; not one of the package's own modules)
            if FLAGS.debug or (e.name or "").partition(".")[0] in ("dare_tf", "data", "serving", "trainers"):
                raise
            print(f"error: {e}: a package dare-tf needs is not installed: pip install \"dare-tf[jax]\" (the trainer "
                  "on JAX) or \"dare-tf[all]\" (everything), docs/gpu.md", file=sys.stderr, flush=True)
            sys.exit(1)
        except (app.UsageError, ValueError, OSError, KeyError, FloatingPointError) as e:
            if FLAGS.debug:
                raise
            text = " ".join(str(e).split()) or type(e).__name__
            if isinstance(e, KeyError):
                text = f"missing {text}"
            usage = isinstance(e, app.UsageError)
            print(f"error: {flag_message(text)}" + (" (see --help)" if usage else ""), file=sys.stderr,
                  flush=True)
            if getattr(e, "exit_at_once", False):  # (e.g. after an allocation failed: no teardown)
                sys.stdout.flush()
                os._exit(1)
            sys.exit(2 if usage else 1)

    program = sys.modules.get(main.__module__)
    if main.__module__ != "__main__" and program is not None:
        # Run through a console script: --help describes the program module.
        for flag in FLAGS.get_key_flags_for_module(program):
            FLAGS.register_key_flag_for_module(sys.argv[0], flag)
        sys.modules["__main__"].__doc__ = program.__doc__
    app.run(guarded, flags_parser=_parse_flags)


_HELP = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def shipped_flagfiles(argv: list[str]) -> list[str]:
    """`argv` with each `--flagfile=configs/NAME.flags` that does not exist from the
    working directory replaced by the installed package's copy of it
    (`dare_tf._programs.configs`): the documented command lines work from any
    directory after `pip install dare-tf`. Other paths are left to absl."""
    out = list(argv)
    for i, arg in enumerate(out):
        name, eq, path = arg.partition("=")
        if name.lstrip("-") != "flagfile" or not name.startswith("-"):
            continue
        if not eq:  # --flagfile PATH
            if i + 1 >= len(out):
                continue
            i, path = i + 1, out[i + 1]
        folder, base = os.path.split(os.path.normpath(path))
        if folder != "configs" or os.path.exists(path):
            continue
        import importlib.util

        spec = importlib.util.find_spec("dare_tf._programs.configs")
        shipped = [os.path.join(d, base) for d in (spec.submodule_search_locations or [])] if spec else []
        for candidate in shipped:
            if os.path.isfile(candidate):
                out[i] = f"{name}={candidate}" if eq else candidate
                break
    return out


def _parse_flags(argv):
    """absl's flag parsing, with a bad flag reported in one line (exit code 2)."""
    try:
        return FLAGS(shipped_flagfiles(argv))
    except SystemExit as e:  # absl's --help exits with 1 after printing the help
        asked = any(a.split("=")[0] in _HELP for a in argv[1:])
        sys.exit(0 if asked and e.code == 1 else e.code)
    except flags.Error as e:
        print(f"error: {e} (see --help)", file=sys.stderr, flush=True)
        sys.exit(2)
