// Whether AddressSanitizer instruments this build: GCC defines __SANITIZE_ADDRESS__, clang before
// 17 only answers __has_feature. Under it the fiber switch (emu_context.cpp) and the device
// allocations (emu_runtime.cpp) tell it what they do.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define SHARDLM_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHARDLM_EMU_ASAN 1
#endif
#endif

#ifdef SHARDLM_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
