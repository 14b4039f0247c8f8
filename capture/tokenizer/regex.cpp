#include "capture/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

#include "capture/tokenizer/unicode.h"

namespace kvscope::tokenizer {

namespace {

// Per-thread match state: JIT stacks and match data must not be shared
// between threads, and allocating them per call would dominate short pieces.
struct ThreadState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    // Long runs of spaces make backtracking patterns such as \s+(?!\S) go
    // deep; the default 32 KiB JIT stack is too small for them.
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadState& thread_state() {
  thread_local ThreadState state;
  return state;
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern) : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw std::invalid_argument("invalid regex at offset " + std::to_string(offset) + ": " +
                                reinterpret_cast<const char*>(message));
  }
  // JIT is an optimisation only: without it pcre2_match interprets.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

void Regex::find_all(const char* s, size_t n, std::vector<std::pair<size_t, size_t>>* out) const {
  ThreadState& st = thread_state();
  size_t pos = 0;
  size_t last_end = std::string::npos;
  while (pos <= n) {
    int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(s), n, pos, PCRE2_NO_UTF_CHECK,
                         st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw std::runtime_error("regex match failed (" + pattern_ +
                               "): " + reinterpret_cast<const char*>(message));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    size_t start = ov[0], end = ov[1];
    if (start == end) {
      if (start == last_end) {
        // Oniguruma's rule: no empty match immediately after a match.
        if (start >= n) return;
        pos = start + unicode::char_length(static_cast<unsigned char>(s[start]));
        continue;
      }
      out->emplace_back(start, end);
      last_end = end;
      if (start >= n) return;
      pos = start + unicode::char_length(static_cast<unsigned char>(s[start]));
      continue;
    }
    out->emplace_back(start, end);
    last_end = end;
    pos = end;
  }
}

}  // namespace kvscope::tokenizer
