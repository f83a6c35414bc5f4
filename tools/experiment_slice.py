"""Write a copy of an experiment file keeping only the named trials, in chapter order.

    python tools/experiment_slice.py SRC DST CHAPTER/TRIAL[:num_requests=N] ... | CHAPTER ...

`:num_requests=N` cuts that trial's measured requests (GPU time is scarce: cut requests, not chapters); the
trial is then a different trial (its key includes the workload), stored beside the full one. A bare CHAPTER
keeps all its trials.
"""
import sys
import yaml

src, dst, *keep = sys.argv[1:]
doc = yaml.safe_load(open(src))
want: dict[str, dict[str, int | None]] = {}
for k in keep:
    name, _, cut = k.partition(":num_requests=")
    if "/" not in name:  # a whole chapter
        want[name] = {t["name"]: None for t in doc["chapters"][name]["trials"]}
        continue
    ch, tr = name.split("/")
    want.setdefault(ch, {})[tr] = int(cut) if cut else None
chapters = {}
for name, ch in doc["chapters"].items():
    if name in want:
        trials = []
        for t in ch["trials"]:
            if t["name"] in want[name]:
                n = want[name][t["name"]]
                if n is not None:
                    t = {**t, "workload": {**(t.get("workload") or {}), "num_requests": n}}
                trials.append(t)
        # the chapter's baseline stays named even when it is not in the cut (measured in another call), so
        # every run stores the baseline it is compared against; the loader does not ask for it to be present
        chapters[name] = {**ch, "baseline": ch.get("baseline") or ch["trials"][0]["name"], "trials": trials}
doc["chapters"] = chapters
yaml.safe_dump(doc, open(dst, "w"), sort_keys=False)
print("slice:", {k: [t["name"] for t in v["trials"]] for k, v in chapters.items()})
