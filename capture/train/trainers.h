// Each trainer's descriptor, defined in the trainer's own file; registry.cpp
// lists them in `kvscope train --list` order.
#pragma once

#include "capture/train/registry.h"

namespace kvscope::gates {

// The gated-attention trainer's methods (gated_methods.cpp).
TrainerDescriptor wgkv_trainer();
TrainerDescriptor attention_gate_trainer();
TrainerDescriptor retention_trainer();
TrainerDescriptor retention_global_trainer();
TrainerDescriptor kvpop_trainer();
TrainerDescriptor streaming_plus_trainer();
TrainerDescriptor dms_trainer();
// The others, one file each.
TrainerDescriptor sfc_trainer();            // sfc_trainer.cpp
TrainerDescriptor qfilter_trainer();        // query_calibration.cpp
TrainerDescriptor query_stats_trainer();    // query_calibration.cpp
TrainerDescriptor kvzap_trainer();          // kvzap_calibration.cpp
TrainerDescriptor fastkvzip_trainer();      // fastkvzip_training.cpp
TrainerDescriptor restorekv_trainer();      // restorekv_training.cpp
TrainerDescriptor duo_attention_trainer();  // duo_attention_training.cpp
TrainerDescriptor lukv_trainer();           // lukv_profiling.cpp

}  // namespace kvscope::gates
