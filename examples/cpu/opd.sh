#!/usr/bin/env bash
# On-policy distillation (GKD, Agarwal et al., ICLR 2024; docs/distillation.md): the student samples, the teacher
# scores each sampled token, and each token's advantage is -(log pi_student - log pi_teacher); no task reward trained on.
# Student: the embedded tiny model; teacher: embedded-teacher, the embedded model fine-tuned further (built on first
# use, ~20 s; validation accuracy 0.96 against the student's 0.30). CPU only, no download.
# Knobs: examples/common.sh (TEACHER among them); extra args are Hydra overrides, e.g.
#   STEPS=100 bash examples/cpu/opd.sh            or, GRPO plus distillation:
#   ALGO=grpo EXPERIMENT=grpo_distill bash examples/cpu/opd.sh algorithm.distill.coef=0.5
set -euo pipefail
ALGO=${ALGO:-opd}
TEACHER=${TEACHER:-embedded-teacher}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
