"""The arithmetic of the simulator counts (:mod:`numba_attn.measure.simcount`): the accesses a block's
lanes recorded, grouped into warp instructions, become global sectors, shared wavefronts and bank conflicts,
added to the totals."""
from __future__ import annotations

from collections import defaultdict

WARP = 32
SECTOR_BYTES = 32
BANKS = 32
BANK_BYTES = 4

_OPS = {"mma": "sim_mma", "ldmatrix": "sim_ldmatrix", "cp_async": "sim_cp_async", "shfl": "sim_shuffles",
        "syncwarp": "sim_syncwarps"}


def _smem_access(tot: dict, kind: str, nbytes: int) -> None:
    """One warp-level shared-memory load ("sl") or store of ``nbytes`` into the totals."""
    if kind == "sl":
        tot["sim_smem_loads"] += 1
        tot["sim_smem_load_bytes"] += nbytes
    else:
        tot["sim_smem_stores"] += 1
        tot["sim_smem_store_bytes"] += nbytes


def add_block(tot: dict, lanes, named: dict, site_kind: list) -> None:
    """Adds one finished block to the totals ``tot``: its barriers (``named``: its named barriers), its lanes'
    direct counts, and their recorded accesses (``lane.log``, emptied), grouped into warp instructions by
    (warp, epoch, site, k); ``site_kind``: site number -> kind."""
    tot["sim_blocks"] += 1
    tot["sim_barriers"] += max((st.syncs for st in lanes), default=0)
    tot["sim_named_barriers"] += sum(int(s.generation) for s in named.values())
    groups = defaultdict(list)
    for st in lanes:
        for name, n in st.direct.items():
            tot[name] += n
        w, lane = st.warp, st.lane
        for site, epoch, k, root, off, n in st.log:
            groups[(w, epoch, site, k)].append((lane, root, off, n))
        st.log = []
    for (w, epoch, site, k), acc in groups.items():
        kind = site_kind[site]
        if kind in ("gl", "gs"):
            nbytes = sum(a[3] for a in acc)
            if all((off & 31) + n <= SECTOR_BYTES for _, _, off, n in acc):  # each access in one sector
                nsec = len({(root, off >> 5) for _, root, off, _ in acc})
            else:
                nsec = len({(root, s) for _, root, off, n in acc
                            for s in range(off // SECTOR_BYTES, (off + n - 1) // SECTOR_BYTES + 1)})
            if kind == "gl":
                tot["sim_gmem_loads"] += 1
                tot["sim_gmem_read_bytes"] += nbytes
                tot["sim_gmem_read_sectors"] += nsec
            else:
                tot["sim_gmem_stores"] += 1
                tot["sim_gmem_write_bytes"] += nbytes
                tot["sim_gmem_write_sectors"] += nsec
        elif kind in ("sl", "ss"):
            width = max(a[3] for a in acc)
            nbytes = sum(a[3] for a in acc)
            if width <= 4 and all((off & 3) + n <= 4 for _, _, off, n in acc):  # one word per lane, one phase
                per_bank = [0] * BANKS
                for _, word in {(root, off >> 2) for _, root, off, _ in acc}:
                    per_bank[word & 31] += 1
                waves = max(per_bank)
                tot["sim_smem_wavefronts"] += waves
                tot["sim_bank_conflicts"] += waves - 1
                _smem_access(tot, kind, nbytes)
                continue
            per = WARP if width <= 4 else (16 if width <= 8 else 8)
            phases = {}
            nbytes = 0
            for lane, root, off, n in acc:
                nbytes += n
                banks = phases.get(lane // per)
                if banks is None:
                    banks = phases[lane // per] = {}
                for word in range(off >> 2, ((off + n - 1) >> 2) + 1):
                    b = banks.get(word & 31)
                    if b is None:
                        banks[word & 31] = {(root, word)}
                    else:
                        b.add((root, word))
            waves = sum(max(len(s) for s in banks.values()) for banks in phases.values())
            tot["sim_smem_wavefronts"] += waves
            tot["sim_bank_conflicts"] += waves - len(phases)
            _smem_access(tot, kind, nbytes)
        else:
            tot[_OPS[kind]] += max(a[3] for a in acc)


def with_sums(totals: dict) -> dict:
    """The row fields of the totals: a copy with the sums of other fields (``sim_gmem_sectors``) filled in."""
    out = dict(totals)
    out["sim_gmem_sectors"] = out["sim_gmem_read_sectors"] + out["sim_gmem_write_sectors"]
    return out
