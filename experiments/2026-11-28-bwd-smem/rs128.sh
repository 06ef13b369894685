#!/usr/bin/env bash
# dV's and dK's A from the registers at D128 (rs=True; 255 registers, no spill offline) against the Pᵀ and dSᵀ
# tiles: OUT=dir bash rs128.sh
NAME=rs PARAMS='{"rs": true}' DIMS=128 exec bash "$(dirname "$0")/variants.sh"
