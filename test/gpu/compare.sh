#!/usr/bin/env bash
# compare.sh PREDICTIONS MEASURED: prints each prediction (test/gpu/predictions.tsv) beside what the GPU suite
# measured (FAAS_GPU_MEASURED_TSV: pass, shim/native, native ms, shim ms), the error of the point prediction and
# whether the measurement fell inside the band; a pass not measured says so. Exit status 0 (a miss is a finding,
# not a failure of the suite).
set -euo pipefail
pred=$1 meas=$2
[ -f "$meas" ] || meas=/dev/null
awk -F'\t' '
	FNR == NR { if ($0 !~ /^#/ && NF >= 2) { m[$1] = $2; n[$1] = $3; s[$1] = $4 } next }
	/^#/ || NF < 6 { next }
	BEGIN { printf "%-18s %-6s %-13s %-9s %-9s %-9s %-7s %s\n", "pass", "point", "band", "measured", "error", "in band", "held", "native/shim ms" }
	{
		if ($1 in m) {
			err = (m[$1] - $2) / $2 * 100
			in_band = (m[$1] >= $3 && m[$1] <= $4) ? "yes" : "NO"
			printf "%-18s %-6s %-13s %-9.3f %+8.1f%% %-9s %-7s %s / %s\n", $1, $2, $3 "-" $4, m[$1], err, in_band, $5, n[$1], s[$1]
		} else {
			printf "%-18s %-6s %-13s %-9s %-9s %-9s %-7s\n", $1, $2, $3 "-" $4, "-", "-", "not run", $5
		}
	}' "$meas" "$pred"
