// The evaluator: runs a parsed template against its variables.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/jinja/parser.h"
#include "core/jinja/value.h"

namespace kvscope::jinja {

struct Limits {
  int64_t max_depth = 256;
  int64_t max_loop_iterations = 1'000'000;
  int64_t max_output_bytes = 64 << 20;
};

// One level of variables: the globals, the template's top level, a loop
// iteration, a macro call. Lookups fall through to the parent.
struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* lookup(const std::string& name) const;
};
using ScopePtr = std::shared_ptr<Scope>;

class Renderer {
 public:
  Renderer(const Limits& limits, std::string name) : limits_(limits), name_(std::move(name)) {}
  // Empties the namespaces it made: `set ns.me = ns` would otherwise leak a cycle.
  ~Renderer();
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string render(const Body& body, const Value& globals);

  // For filters and tests that call back into the engine.
  Value apply_filter(const std::string& name, const Value& subject, Args& args);
  bool apply_test(const std::string& name, const Value& subject, Args& args);
  Value call(const Value& callee, Args& args);
  void count_iterations(int64_t n);
  const Limits& limits() const { return limits_; }

 private:
  enum class Flow { Normal, Break, Continue };
  class Depth;

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  Flow exec_if(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  void exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  void exec_set(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  void exec_macro(const Stmt& stmt, const ScopePtr& scope);
  void exec_call_block(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  void exec_with(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  Value call_macro(const Stmt& macro, const ScopePtr& closure, Args& args, const Value* caller);
  Value make_loop(const std::vector<Value>& items, size_t index,
                  const std::shared_ptr<Value>& last_changed);
  void assign(const Expr& target, const Value& value, Scope& scope);
  void append(std::string& out, const std::string& text);

  Value eval(const Expr& expr, const ScopePtr& scope);
  Value eval_call(const Expr& expr, const ScopePtr& scope, const Value* caller);
  Value eval_compare(const Expr& expr, const ScopePtr& scope);
  Value eval_literal(const Expr& expr, const ScopePtr& scope);
  Value eval_slice(const Expr& expr, const ScopePtr& scope);
  Value eval_filter(const Expr& expr, const ScopePtr& scope, const Value* subject);
  Value eval_test(const Expr& expr, const ScopePtr& scope);
  Args eval_args(const Expr& expr, const ScopePtr& scope, size_t first);

  Limits limits_;
  std::string name_;
  int64_t depth_ = 0;
  int64_t iterations_ = 0;
  std::vector<Value> namespaces_;
};

// Counts nesting (statements, expressions, calls) against Limits::max_depth.
class Renderer::Depth {
 public:
  explicit Depth(Renderer& r) : r_(r) {
    if (++r_.depth_ > r_.limits_.max_depth)
      throw TemplateLimitError("recursion depth " + std::to_string(r_.limits_.max_depth));
  }
  ~Depth() { --r_.depth_; }
  Depth(const Depth&) = delete;
  Depth& operator=(const Depth&) = delete;

 private:
  Renderer& r_;
};

}  // namespace kvscope::jinja
