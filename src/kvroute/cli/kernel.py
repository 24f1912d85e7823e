"""``kvroute kernel``: the opt-in kept-entries attention kernel (build it ahead of use, see whether it is there)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvroute.cli.core import _App, app
from kvroute.console import console, print_json

kernel_app = _App(help="The optional kept-entries attention kernel (C++, AVX-512, CPU float32).",
                  no_args_is_help=True)
app.add_typer(kernel_app, name="kernel")


def _state() -> dict[str, object]:
    import torch

    from kvroute.engine.attention import kept, resolve_backend
    from kvroute.engine.kept_build import kernels_folder

    off = not kept.ENABLED or not resolve_backend().kept  # KVROUTE_KEPT_KERNEL=0, read as a decode reads it
    return {"applies": kept.kept_applies(torch.device("cpu"), torch.float32, 64), "avx512": kept._avx512(),
            "switched_off": off, "built": kept.kernel() is not None, "folder": str(kernels_folder()),
            "name": kept._spec().name}


@kernel_app.command("build")
def kernel_build() -> None:
    """Build the kernel for this machine (about 30 s idle; once per CPU, PyTorch and Python) and check it loads.

    The default path does without it: on the main job's cells it saved nothing against PyTorch's kernels, on
    long contexts 19-37% of the grid's time (docs/performance.md). Once built, `decoding.attention_backend =
    "auto"` uses it where it applies, and `"kept"` names it. Exits 1 with why, in one line, where it cannot be
    built here.
    """
    from kvroute.engine.attention import kept
    from kvroute.engine.kept_build import KernelUnavailable, kernels_folder

    try:
        kept.build_kernel()
    except KernelUnavailable as e:
        from kvroute.cli.core import _print_error

        _print_error(f"the kept-entries attention kernel cannot be built here: {e}; PyTorch's kernels run instead")
        raise typer.Exit(1) from None
    console.print(f"kept-entries attention kernel: built and loaded ({kernels_folder() / kept._spec().name}.so)",
                  highlight=False, soft_wrap=True)


@kernel_app.command("status")
def kernel_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the state as one JSON object.")] = False,
) -> None:
    """Whether the kernel is built on this machine and whether it can run here (AVX-512, not switched off)."""
    state = _state()
    if as_json:
        print_json(state)
        return
    if state["switched_off"]:
        line = f"switched off (KVROUTE_KEPT_KERNEL=0){'; built' if state['built'] else ''}"
    elif not state["avx512"]:
        line = "cannot run here: this CPU has no AVX-512"
    elif state["built"]:
        line = f"built ({state['folder']}); `auto` uses it on CPU float32 models with head sizes {_sizes()}"
    else:
        line = "not built; `kvroute kernel build` builds it (PyTorch's kernels run meanwhile)"
    console.print(f"kept-entries attention kernel: {line}", highlight=False, soft_wrap=True)


def _sizes() -> str:
    from kvroute.engine.attention.kept import HEAD_DIMS

    return "/".join(map(str, HEAD_DIMS))
