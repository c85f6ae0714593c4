#!/usr/bin/env bash
# Before / after on one GPU in one call: this checkout against older trees' `src` carried in
# .carry/oldtree-dec (the decoder's baseline) and .carry/oldtree-enc (the encoders'), made with
#   git archive REV src | tar -x -C .carry/oldtree-dec     (2.7 MB each)
# and, optionally, .carry/newtree (git archive HEAD src) for the "new" side.
# Rounds alternate old / new so a drift of the card's clocks hits both. Writes JSON lines to $OUT.
#   DEC_ROUNDS (2), ENC_ROUNDS (2), TREE_AB_STAGES ("dec enc bench")
set -u
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
STAGES=" ${TREE_AB_STAGES:-dec enc bench} "
log() { echo "== $(date -u +%H:%M:%S) $*"; }
OUT=$OUT bash scripts/gpu_check.sh none >/dev/null 2>&1
export PYTHONPATH=/tmp/zoi_site${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
# "new" is .carry/newtree when carried (git archive HEAD src: the commit, not the edits of the
# working tree), else this checkout
NEW=new; [[ -d .carry/newtree/src ]] && NEW=.carry/newtree
run() {  # run TAG TREE script args...
  local tag=$1 tree=$2
  shift 2
  if [[ $tree == new ]]; then
    timeout "${STEP_TIMEOUT:-200}" $PY "$@"
  else
    timeout "${STEP_TIMEOUT:-200}" $PY lab/gpu/run_tree.py "$tree/src" "$@"
  fi 2>&1 | grep -E '^\{| p50 |Error|error' | sed -e "s/^{/{\"tree\": \"$tag\", /" -e "/^{/!s/^/$tag /" \
    | tee -a "$OUT/tree_ab_${STAMP}.log"
}
if [[ $STAGES == *" dec "* && -d .carry/oldtree-dec/src ]]; then
  for r in $(seq "${DEC_ROUNDS:-2}"); do
    log "decode round $r"
    for t in old new; do
      tree=$NEW; [[ $t == old ]] && tree=.carry/oldtree-dec
      run "dec-$t" "$tree" lab/gpu/decode_ab.py --variants base --pipeline-only --new 96
    done
  done
fi
if [[ $STAGES == *" enc "* && -d .carry/oldtree-enc/src ]]; then
  for r in $(seq "${ENC_ROUNDS:-2}"); do
    log "encoder round $r"
    for t in old new; do
      tree=$NEW; [[ $t == old ]] && tree=.carry/oldtree-enc
      run "enc-$t" "$tree" lab/gpu/bench.py --models minilm,bert-base --shapes 1x128,32x128,256x128 \
        --no-gemm --no-variants --out "$OUT/enc_${t}_${r}.json"
    done
  done
fi
if [[ $STAGES == *" bench "* ]]; then
  log "zoi bench --device cuda --quick (zoi and the PyTorch peers)"
  timeout "${BENCH_TIMEOUT:-240}" $PY -m zoi.bench.cli --device cuda --quick --no-rss \
    --out "$OUT/gpu_harness_${STAMP}.json" 2>&1 | tail -30
fi
log done
