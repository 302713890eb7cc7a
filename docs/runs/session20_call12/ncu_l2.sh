#!/usr/bin/env bash
# Session 20 call 12: which L2 sub-unit sits at 76% (lts__throughput breakdown) during v11 GEMM 1, exact vs multinomial
# 512 rows per expert (dsv3, 128 experts, clusters of 2), and the SM-side inbound bytes.
B=${PREBUILT:?}; out=${OUT:-out}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
m="breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,breakdown:gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
m+=",l1tex__m_xbar2l1tex_read_bytes.sum,l1tex__m_xbar2l1tex_read_bytes.sum.pct_of_peak_sustained_elapsed,gpu__time_duration.sum"
m+=",sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__t_sectors.sum,lts__t_sectors_srcunit_ltcfabric.sum"
m+=",lts__t_sectors_srcunit_tex.sum,dram__bytes_read.sum,smsp__cycles_active.avg,sm__cycles_elapsed.avg.per_second"
for spread in none multinomial; do
  timeout 80 "$NCU" --clock-control none --kernel-name regex:sm90_fp8_wide_gemm1_kernel --launch-skip 1 --launch-count 1 \
    --metrics "$m" "$B/megamoe" bench gemm --gemms 1 --format fp8 --gemm1-v9 on --gemm1-v11 on --models dsv3 \
    --experts 128 --rows 512 --rows-spread $spread --no-cublas --repeats 2 > "$out/ncu_l2_$spread.txt" 2>&1
  echo "== $spread rc=$?"
  grep -E "^\s+(lts|l1tex|gpu__|sm__|dram|smsp|ltc)" "$out/ncu_l2_$spread.txt" | awk '{v=$NF; print}' | sort -k3 -g -r | head -40
done
