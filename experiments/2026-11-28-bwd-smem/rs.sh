#!/usr/bin/env bash
# dV's and dK's A from the registers at D64 (rs=True) against the Pᵀ and dSᵀ tiles: OUT=dir bash rs.sh
NAME=rs PARAMS='{"rs": true}' DIMS=64 exec bash "$(dirname "$0")/variants.sh"
