"""The GPU's state while a row is timed: SM clock, power, temperature and clock-event reasons, read through NVML.

A kernel's time depends on the clock it ran at, and on a power-capped GPU the clock depends on what ran before
(an H200 at its 690 W cap: 1770 MHz in a burst after idle, 1650 MHz sustained). So every timed row records the
state at the start and at the end of its timed calls (:func:`row_fields`; in interleaved rounds the mean over
its rounds): ``sm_clock_mhz_start``/``_end``, ``power_w_start``/``_end``, ``temperature_c_start``/``_end``,
``clocks_events`` (the reasons NVML gives for holding the clock down, e.g. ``sw_power_cap``) and
``nvml_samples``. NVML's power reading is averaged over about one second on Ampere and later GPUs.

NVML comes from ``pynvml`` (the ``nvidia-ml-py`` package) when importable, else from ``cuda.bindings.nvml``
(cuda-bindings 13, which numba-cuda installs); neither is required. Without them, or in the simulator, the
fields are absent and rows carry ``nvml_note`` saying why. The device is the one numba uses in this process,
found by its UUID (else its PCI bus id), so ``CUDA_VISIBLE_DEVICES`` does not mislead it.
"""
from __future__ import annotations

import statistics

# nvmlClocksEventReasons bits (stable in NVML's ABI) → the names rows record
EVENT_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
QUANTITIES = ("sm_clock_mhz", "power_w", "temperature_c")  # the numeric readings of a sample


def reason_names(mask) -> list[str]:
    """The names of the clock-event reasons set in ``mask`` (unknown bits as hex)."""
    mask = int(mask or 0)
    out = [name for bit, name in EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(EVENT_REASONS)
    return out + ([hex(rest)] if rest else [])


class _Pynvml:
    """NVML through ``pynvml`` (nvidia-ml-py)."""

    source = "pynvml"

    def __init__(self):
        import pynvml

        self.m = pynvml
        pynvml.nvmlInit()

    def handle(self, uuid, pci):
        m = self.m
        if uuid:
            try:
                return m.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:  # noqa: BLE001 - older bindings want bytes; else the bus id
                try:
                    return m.nvmlDeviceGetHandleByUUID(uuid.encode())
                except Exception:  # noqa: BLE001
                    pass
        return m.nvmlDeviceGetHandleByPciBusId(pci)

    def read(self, h) -> dict:
        m = self.m
        events = getattr(m, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(m, "nvmlDeviceGetCurrentClocksThrottleReasons", None)  # (the older name)
        return _read({"sm_clock_mhz": lambda: m.nvmlDeviceGetClockInfo(h, m.NVML_CLOCK_SM),
                      "power_w": lambda: m.nvmlDeviceGetPowerUsage(h) / 1e3,
                      "temperature_c": lambda: m.nvmlDeviceGetTemperature(h, m.NVML_TEMPERATURE_GPU),
                      "clocks_events": lambda: events(h)})


class _Bindings:
    """NVML through ``cuda.bindings.nvml`` (cuda-bindings 13)."""

    source = "cuda.bindings.nvml"

    def __init__(self):
        from cuda.bindings import nvml

        self.m = nvml
        nvml.init_v2()

    def handle(self, uuid, pci):
        if uuid:
            try:
                return self.m.device_get_handle_by_uuid(uuid)
            except Exception:  # noqa: BLE001 - else the bus id
                pass
        return self.m.device_get_handle_by_pci_bus_id_v2(pci)

    def read(self, h) -> dict:
        m = self.m
        return _read({"sm_clock_mhz": lambda: m.device_get_clock_info(h, m.ClockType.SM),
                      "power_w": lambda: m.device_get_power_usage(h) / 1e3,
                      "temperature_c": lambda: m.device_get_temperature_v(h, m.TemperatureSensors.GPU),
                      "clocks_events": lambda: m.device_get_current_clocks_event_reasons(h)})


def _read(getters: dict) -> dict:
    """Each reading that works (a query the GPU does not support is left out)."""
    out = {}
    for key, get in getters.items():
        try:
            value = get()
        except Exception:  # noqa: BLE001
            continue
        out[key] = int(value) if key == "clocks_events" else float(value)
    return out


class Monitor:
    """The NVML readings of this process's GPU; ``note`` says why there are none (``sample()`` then gives None)."""

    def __init__(self, api=None, handle=None, note: str | None = None):
        self.api, self.handle, self.note = api, handle, note
        self.source = getattr(api, "source", None)

    def sample(self) -> dict | None:
        if self.api is None:
            return None
        try:
            return self.api.read(self.handle) or None
        except Exception:  # noqa: BLE001 - a reading never fails a row
            return None


def _device_ids():
    """(UUID, PCI bus id) of numba's current device, as NVML names them."""
    from numba import cuda

    dev = cuda.get_current_device()
    uuid = None
    try:
        uuid = str(dev.uuid)
    except Exception:  # noqa: BLE001
        pass
    pci = f"{int(dev.PCI_DOMAIN_ID):08x}:{int(dev.PCI_BUS_ID):02x}:{int(dev.PCI_DEVICE_ID):02x}.0"
    return uuid, pci


def open_monitor(apis=(_Pynvml, _Bindings), ids=_device_ids) -> Monitor:
    """A :class:`Monitor` of numba's current device through the first NVML binding that opens it."""
    from numba_attn.gpu.backend import IS_SIMULATOR

    if IS_SIMULATOR:
        return Monitor(note="no NVML readings in the simulator (nothing is timed there)")
    whys = []
    for make in apis:
        try:
            api = make()
            return Monitor(api, api.handle(*ids()))
        except Exception as exc:  # noqa: BLE001 - missing module, no driver, device not found
            whys.append(f"{getattr(make, 'source', make.__name__)}: {type(exc).__name__}: {str(exc)[:80]}")
    return Monitor(note="no clock or power readings: NVML not usable (pip install nvidia-ml-py; "
                        + "; ".join(whys) + ")")


_MONITOR: Monitor | None = None


def monitor() -> Monitor:
    """This process's :class:`Monitor`, opened once."""
    global _MONITOR
    if _MONITOR is None:
        _MONITOR = open_monitor()
    return _MONITOR


def row_fields(pairs, note: str | None = None) -> dict:
    """A row's NVML fields from ``(start, end)`` samples (one pair per timed stretch: the mean over the pairs);
    only ``nvml_note`` when there is no sample."""
    pairs = [(s, e) for s, e in pairs if s or e]
    if not pairs:
        return {"nvml_note": note or "no NVML sample"}
    out: dict = {}
    for q in QUANTITIES:
        for end, suffix in ((0, "start"), (1, "end")):
            vals = [p[end][q] for p in pairs if p[end] and q in p[end]]
            if vals:
                out[f"{q}_{suffix}"] = round(statistics.fmean(vals), 1)
    masks = [p[i].get("clocks_events", 0) for p in pairs for i in (0, 1) if p[i]]
    if any("clocks_events" in (p[i] or {}) for p in pairs for i in (0, 1)):
        names = []
        for m in masks:
            names += [n for n in reason_names(m) if n not in names]
        out["clocks_events"] = names
    out["nvml_samples"] = len(pairs)
    return out


NVML_FIELDS = tuple(f"{q}_{s}" for q in QUANTITIES for s in ("start", "end")) + ("clocks_events", "nvml_samples")


def environment_fields() -> dict:
    """The run's record of NVML: its source, or why there is none (``nvml_note``)."""
    m = monitor()
    return {"nvml": m.source} if m.api is not None else {"nvml_note": m.note}
