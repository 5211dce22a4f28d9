// A minimal NVTX tool for tests (libloom_test_nvtx_tool.so, loaded by NVTX from NVTX_INJECTION64_PATH, as
// Nsight Systems' is): it prints each domain created and each range pushed and popped, one line per event, on stdout:
//   domain loom
//   push loom::ag_gemm M=8192 N=4096 K=8192
//   pop
#define NVTX_NO_IMPL  // the tool side: NVTX's types, not its implementation (that is in the program's modules)
#include <nvtx3/nvToolsExt.h>

#include <cstdio>

namespace {

int g_domain_tag;  // the address is the one domain handle this tool hands out

nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
    std::printf("domain %s\n", name);
    return reinterpret_cast<nvtxDomainHandle_t>(&g_domain_tag);
}

int NVTX_API range_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
    const bool ours = d == reinterpret_cast<nvtxDomainHandle_t>(&g_domain_tag);
    const bool ascii = a != nullptr && a->messageType == NVTX_MESSAGE_TYPE_ASCII;
    std::printf("push %s%s\n", ascii ? a->message.ascii : "(not an ASCII message)", ours ? "" : " (unknown domain)");
    return 0;
}

int NVTX_API range_pop(nvtxDomainHandle_t d) {
    std::printf("pop%s\n", d == reinterpret_cast<nvtxDomainHandle_t>(&g_domain_tag) ? "" : " (unknown domain)");
    return 0;
}

template <class F>
bool install(NvtxFunctionTable table, unsigned size, unsigned id, F* fn) {
    if (id >= size || table[id] == nullptr) return false;
    *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
    return true;
}

int NVTX_API inject(NvtxGetExportTableFunc_t get_export_table) {
    const auto* cb = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
    NvtxFunctionTable table = nullptr;
    unsigned size = 0;
    if (cb == nullptr || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size)) return 0;
    return install(table, size, NVTX_CBID_CORE2_DomainCreateA, &domain_create) &&
           install(table, size, NVTX_CBID_CORE2_DomainRangePushEx, &range_push) &&
           install(table, size, NVTX_CBID_CORE2_DomainRangePop, &range_pop);
}

}  // namespace

// The entry point NVTX looks up in the library named by NVTX_INJECTION64_PATH.
extern "C" __attribute__((visibility("default"))) int NVTX_API
InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
    return inject(get_export_table);
}
