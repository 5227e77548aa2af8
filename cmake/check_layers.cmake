# cmake -DHS_ROOT=<source tree> [-DHS_STAMP=<file>] -P cmake/check_layers.cmake
#
# Checks the layer order (cmake/layers.cmake) over the tree at HS_ROOT
# (default: this repository) and fails naming every violation. With
# HS_STAMP, touches that file on success (the build's hs_layer_check target).
cmake_minimum_required(VERSION 3.20)
include(${CMAKE_CURRENT_LIST_DIR}/layers.cmake)
if(NOT HS_ROOT)
  get_filename_component(HS_ROOT ${CMAKE_CURRENT_LIST_DIR}/.. ABSOLUTE)
endif()
hs_require_layers(${HS_ROOT})
if(HS_STAMP)
  file(TOUCH ${HS_STAMP})
endif()
