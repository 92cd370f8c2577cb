"""CUDA visibility: the GPUs this node's processes will see, against what the config asks for."""

from __future__ import annotations

import os

from fleetrl.doctor.context import Context
from fleetrl.doctor.result import Check, failed, passed, skipped
from fleetrl.plan.layout import GPU_DRIVER_PATHS, gpu_driver_loaded


def requested_devices(context: Context) -> list[str]:
    return [
        f"{section}.device={getattr(getattr(context.config, section, None), 'device', 'cpu')}"
        for section in ("actor", "rollout")
        if str(getattr(getattr(context.config, section, None), "device", "cpu")).startswith("cuda")
    ]


def check_cuda(context: Context) -> list[Check]:
    name = "cuda"
    wanted = requested_devices(context)
    if not wanted and not gpu_driver_loaded():
        return [
            skipped(name, f"no GPU driver loaded (none of {', '.join(GPU_DRIVER_PATHS)}), and the config asks for none")
        ]
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible_text = "unset" if visible is None else repr(visible)
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    if not wanted:
        if not available:
            return [skipped(name, "no GPU (torch.cuda.is_available() is False), and the config asks for none")]
        return [passed(name, f"{count} GPU(s) visible (CUDA_VISIBLE_DEVICES {visible_text}); the config runs on CPU")]
    if not available:
        build = torch.version.cuda or "none (a CPU-only build)"
        return [
            failed(
                name,
                f"{', '.join(wanted)}, but torch.cuda.is_available() is False "
                f"(torch {torch.__version__}, CUDA build {build}, "
                f"CUDA_VISIBLE_DEVICES {visible_text})",
                "check the driver with nvidia-smi, install a CUDA build of torch, make "
                "sure CUDA_VISIBLE_DEVICES is not empty, or set the devices to cpu",
            )
        ]
    needed = 1
    if context.view.component_placement is not None:
        needed = context.view.devices_per_node()
    for text in wanted:
        index = text.partition("cuda")[2].lstrip(":")
        if index.isdigit():
            needed = max(needed, int(index) + 1)
    names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
    if count < needed:
        return [
            failed(
                name,
                f"{count} GPU(s) visible (CUDA_VISIBLE_DEVICES {visible_text}), the config needs {needed} on this node",
                "make more GPUs visible (CUDA_VISIBLE_DEVICES), or lower cluster.devices_per_node / the device index",
            )
        ]
    return [
        passed(
            name,
            f"{count} GPU(s) visible ({', '.join(names)}; CUDA_VISIBLE_DEVICES "
            f"{visible_text}), {needed} needed on this node",
        )
    ]
