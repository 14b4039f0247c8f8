# Tiered memory for policies that move entries instead of evicting them (the
# SFC): the transfer model of the cold tier's link and head-adaptive budgets.
target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/transfer_link.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hot_budget.cpp
)
