#!/usr/bin/env python3
"""A/B table of `bench layer` JSON files named layer_<key>_<setting>_<round>.json in one folder (the one-call
device scripts write them, settings 0 / 1 alternating over rounds): min over the rounds of each case's rank-0
median per (key, tokens), setting 0 vs 1 and their ratio.
  python3 scripts/layer_ab_table.py FOLDER"""
import collections
import json
import os
import sys


def main(folder):
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("layer_") and name.endswith(".json")):
            continue
        parts = name[:-5].split("_")
        key, setting = "_".join(parts[1:-2]), parts[-2]
        for case in json.load(open(os.path.join(folder, name)))["cases"]:
            times[(key, case["tokens"])][setting].append(case["median_us"])
    print("%-10s %6s | %10s %10s | %7s" % ("case", "tokens", "setting0_us", "setting1_us", "ratio"))
    for (key, tokens), by_setting in sorted(times.items()):
        a = min(by_setting["0"]) if by_setting["0"] else 0.0
        b = min(by_setting["1"]) if by_setting["1"] else 0.0
        print("%-10s %6d | %10.0f %10.0f | %7.3f   (all: %s / %s)" % (
            key, tokens, a, b, a / b if b else 0.0, ["%.0f" % x for x in by_setting["0"]],
            ["%.0f" % x for x in by_setting["1"]]))


if __name__ == "__main__":
    main(sys.argv[1])
