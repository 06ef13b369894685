#!/usr/bin/env bash
# dQ's partials from the registers (dq="red") against one bulk reduction a tile (dq="bulk"), measured at f50d349
# when "bulk" was the default (the sweep's "bwd_wgmma_ss" column): OUT=dir bash red.sh. Since "red" became the
# default, the same comparison is NAME=bulk PARAMS='{"dq": "bulk"}' bash variants.sh.
NAME=red PARAMS='{"dq": "red"}' exec bash "$(dirname "$0")/variants.sh"
