#include "capture/gates/torch_pickle.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include "core/common/input_error.h"

namespace kvscope::gates {

namespace {

// A pickle value, reduced to what a torch.save'd dict of tensors contains.
struct Value {
  enum Kind { None, Bool, Int, Float, Str, Tuple, List, Dict, Global, Storage, Tensor, Mark };
  Kind kind = None;
  int64_t i = 0;
  double f = 0;
  std::string s;                               // Str; Global "module.name"; Storage key
  torch::ScalarType dtype = torch::kFloat32;   // Storage
  std::vector<std::shared_ptr<Value>> items;   // Tuple, List
  std::vector<std::pair<std::string, std::shared_ptr<Value>>> dict;  // Dict (str keys)
  torch::Tensor tensor;
};
using VP = std::shared_ptr<Value>;

VP make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

bool storage_dtype(const std::string& global, torch::ScalarType* out) {
  static const std::map<std::string, torch::ScalarType> types = {
      {"torch.FloatStorage", torch::kFloat32}, {"torch.DoubleStorage", torch::kFloat64},
      {"torch.HalfStorage", torch::kFloat16},  {"torch.BFloat16Storage", torch::kBFloat16},
      {"torch.LongStorage", torch::kInt64},    {"torch.IntStorage", torch::kInt32},
      {"torch.ShortStorage", torch::kInt16},   {"torch.CharStorage", torch::kInt8},
      {"torch.ByteStorage", torch::kUInt8},    {"torch.BoolStorage", torch::kBool}};
  auto it = types.find(global);
  if (it == types.end()) return false;
  *out = it->second;
  return true;
}

class Unpickler {
 public:
  Unpickler(std::string file, const std::string& bytes, caffe2::serialize::PyTorchStreamReader& zip)
      : file_(std::move(file)), b_(bytes), zip_(zip) {}

  VP run() {
    for (;;) {
      const uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;                               // PROTO
        case 0x95: bytes(8); break;                           // FRAME
        case '}': push(make(Value::Dict)); break;             // EMPTY_DICT
        case ']': push(make(Value::List)); break;             // EMPTY_LIST
        case ')': push(make(Value::Tuple)); break;            // EMPTY_TUPLE
        case '(': push(make(Value::Mark)); break;             // MARK
        case 'N': push(make(Value::None)); break;             // NONE
        case 0x88: push_bool(true); break;                    // NEWTRUE
        case 0x89: push_bool(false); break;                   // NEWFALSE
        case 'K': push_int(u8()); break;                      // BININT1
        case 'M': push_int(le(2)); break;                     // BININT2
        case 'J': push_int(int32_t(le(4))); break;            // BININT
        case 0x8a: push_int(long1()); break;                  // LONG1
        case 'G': push_float(); break;                        // BINFLOAT
        case 'X': push_str(bytes(le(4))); break;              // BINUNICODE
        case 0x8c: push_str(bytes(u8())); break;              // SHORT_BINUNICODE
        case 'q': memo(u8()); break;                          // BINPUT
        case 'r': memo(le(4)); break;                         // LONG_BINPUT
        case 0x94: memo(memo_.size()); break;                 // MEMOIZE
        case 'h': push(get(u8())); break;                     // BINGET
        case 'j': push(get(le(4))); break;                    // LONG_BINGET
        case 'c': global(); break;                            // GLOBAL
        case 't': tuple(pop_mark()); break;                   // TUPLE
        case 0x85: tuple(pop_n(1)); break;                    // TUPLE1
        case 0x86: tuple(pop_n(2)); break;                    // TUPLE2
        case 0x87: tuple(pop_n(3)); break;                    // TUPLE3
        case 'Q': persistent_id(); break;                     // BINPERSID
        case 'R': reduce(); break;                            // REDUCE
        case 's': set_items(pop_n(2)); break;                 // SETITEM
        case 'u': set_items(pop_mark()); break;               // SETITEMS
        case 'a': append(pop_n(1)); break;                    // APPEND
        case 'e': append(pop_mark()); break;                  // APPENDS
        case 'b': pop(); break;                               // BUILD: drop the state
        case '.': return pop();                               // STOP
        default:
          fail("pickle opcode 0x" + hex(op) + " at byte " + std::to_string(pos_ - 1) +
               " (only what torch.save writes for a dict of tensors is read)");
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw InputError(file_, "data.pkl", what); }
  static std::string hex(uint8_t v) {
    const char* d = "0123456789abcdef";
    return std::string{d[v >> 4], d[v & 15]};
  }
  uint8_t u8() {
    if (pos_ >= b_.size()) fail("truncated pickle");
    return uint8_t(b_[pos_++]);
  }
  uint64_t le(int n) {
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= uint64_t(u8()) << (8 * k);
    return v;
  }
  int64_t long1() {
    int n = u8();
    if (n > 8) fail("integer wider than 64 bits");
    uint64_t v = le(n);
    if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t(0) << (8 * n);  // sign-extend
    return int64_t(v);
  }
  std::string bytes(uint64_t n) {
    if (n > b_.size() - pos_) fail("truncated pickle");
    std::string s = b_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string line() {
    size_t e = b_.find('\n', pos_);
    if (e == std::string::npos) fail("truncated GLOBAL");
    std::string s = b_.substr(pos_, e - pos_);
    pos_ = e + 1;
    return s;
  }

  void push(VP v) { stack_.push_back(std::move(v)); }
  VP pop() {
    if (stack_.empty()) fail("pickle stack underflow");
    VP v = stack_.back();
    stack_.pop_back();
    return v;
  }
  std::vector<VP> pop_n(size_t n) {
    if (stack_.size() < n) fail("pickle stack underflow");
    std::vector<VP> out(stack_.end() - n, stack_.end());
    stack_.resize(stack_.size() - n);
    return out;
  }
  std::vector<VP> pop_mark() {
    for (size_t k = stack_.size(); k-- > 0;)
      if (stack_[k]->kind == Value::Mark) {
        std::vector<VP> out(stack_.begin() + k + 1, stack_.end());
        stack_.resize(k);
        return out;
      }
    fail("MARK not found");
  }
  void push_bool(bool b) {
    VP v = make(Value::Bool);
    v->i = b;
    push(v);
  }
  void push_int(int64_t i) {
    VP v = make(Value::Int);
    v->i = i;
    push(v);
  }
  void push_float() {
    uint64_t bits = 0;
    for (int k = 0; k < 8; ++k) bits = (bits << 8) | u8();  // big-endian
    VP v = make(Value::Float);
    std::memcpy(&v->f, &bits, 8);
    push(v);
  }
  void push_str(std::string s) {
    VP v = make(Value::Str);
    v->s = std::move(s);
    push(v);
  }
  void memo(uint64_t id) {
    if (stack_.empty()) fail("memo of an empty stack");
    if (memo_.size() <= id) memo_.resize(id + 1);
    memo_[id] = stack_.back();
  }
  VP get(uint64_t id) {
    if (id >= memo_.size() || !memo_[id]) fail("memo " + std::to_string(id) + " not set");
    return memo_[id];
  }
  void global() {
    std::string module = line(), name = line();
    VP v = make(Value::Global);
    v->s = module + "." + name;
    push(v);
  }
  void tuple(std::vector<VP> items) {
    VP v = make(Value::Tuple);
    v->items = std::move(items);
    push(v);
  }
  void append(std::vector<VP> items) {
    VP list = pop();
    if (list->kind != Value::List) fail("APPEND to a non-list");
    for (VP& it : items) list->items.push_back(it);
    push(list);
  }
  void set_items(std::vector<VP> kv) {
    VP d = pop();
    if (d->kind != Value::Dict) fail("SETITEM on a non-dict");
    if (kv.size() % 2) fail("SETITEMS with an odd number of values");
    for (size_t k = 0; k < kv.size(); k += 2) {
      if (kv[k]->kind != Value::Str) fail("a dict key that is not a string");
      d->dict.emplace_back(kv[k]->s, kv[k + 1]);
    }
    push(d);
  }
  // ('storage', torch.FloatStorage, key, location, numel)
  void persistent_id() {
    VP pid = pop();
    if (pid->kind != Value::Tuple || pid->items.size() < 3 || pid->items[0]->s != "storage" ||
        pid->items[1]->kind != Value::Global)
      fail("a persistent id that is not a tensor storage");
    VP v = make(Value::Storage);
    if (!storage_dtype(pid->items[1]->s, &v->dtype)) fail("unsupported storage type " + pid->items[1]->s);
    v->s = pid->items[2]->s;
    push(v);
  }
  static std::vector<int64_t> ints(const VP& t) {
    std::vector<int64_t> out;
    for (const VP& x : t->items) out.push_back(x->i);
    return out;
  }
  torch::Tensor rebuild_tensor(const std::vector<VP>& a) {
    if (a.size() < 4 || a[0]->kind != Value::Storage || a[2]->kind != Value::Tuple ||
        a[3]->kind != Value::Tuple)
      fail("unexpected _rebuild_tensor_v2 arguments");
    const std::string record = "data/" + a[0]->s;
    if (!zip_.hasRecord(record)) fail("missing storage record " + record);
    auto [ptr, nbytes] = zip_.getRecord(record);
    const int64_t elem = int64_t(c10::elementSize(a[0]->dtype));
    torch::Tensor flat = torch::from_blob(ptr.get(), {int64_t(nbytes) / elem},
                                          torch::TensorOptions().dtype(a[0]->dtype))
                             .clone();
    std::vector<int64_t> size = ints(a[2]), stride = ints(a[3]);
    int64_t need = a[1]->i + 1;
    for (size_t d = 0; d < size.size(); ++d) need += (size[d] - 1) * stride[d];
    if (size.size() != stride.size() || (!size.empty() && need > flat.numel()))
      fail("tensor view outside its storage (" + record + ")");
    return flat.as_strided(size, stride, a[1]->i).contiguous();
  }
  void reduce() {
    VP args = pop(), fn = pop();
    if (fn->kind != Value::Global || args->kind != Value::Tuple) fail("REDUCE of a non-global");
    const std::string& g = fn->s;
    VP v;
    if (g == "torch._utils._rebuild_tensor_v2") {
      v = make(Value::Tensor);
      v->tensor = rebuild_tensor(args->items);
    } else if (g == "torch._utils._rebuild_parameter" ||
               g == "torch._utils._rebuild_parameter_with_state") {
      if (args->items.empty() || args->items[0]->kind != Value::Tensor)
        fail("_rebuild_parameter without a tensor");
      v = args->items[0];
    } else if (g == "collections.OrderedDict" || g == "builtins.dict") {
      v = make(Value::Dict);
    } else {
      fail("unsupported pickle global " + g + " (expected a dict of tensors)");
    }
    push(v);
  }

  std::string file_;
  const std::string& b_;
  size_t pos_ = 0;
  caffe2::serialize::PyTorchStreamReader& zip_;
  std::vector<VP> stack_;
  std::vector<VP> memo_;
};

}  // namespace

bool looks_like_torch_save(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "PK\x03\x04", 4) == 0;
}

std::vector<std::pair<std::string, torch::Tensor>> read_torch_save(const std::string& path) {
  if (!std::ifstream(path).good()) throw InputError(path, "", "cannot open");
  if (!looks_like_torch_save(path))
    throw InputError(path, "", "not a torch.save zip archive (legacy pre-1.6 archives are not read)");
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  try {
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    throw InputError(path, "", std::string("unreadable torch.save archive: ") + e.what());
  }
  if (zip->hasRecord("byteorder")) {
    auto [p, n] = zip->getRecord("byteorder");
    if (std::string(static_cast<const char*>(p.get()), n) != "little")
      throw InputError(path, "byteorder", "only little-endian archives are read");
  }
  if (!zip->hasRecord("data.pkl")) throw InputError(path, "data.pkl", "missing");
  auto [ptr, n] = zip->getRecord("data.pkl");
  const std::string pkl(static_cast<const char*>(ptr.get()), n);
  VP root = Unpickler(path, pkl, *zip).run();
  if (root->kind != Value::Dict) throw InputError(path, "data.pkl", "the archive does not hold a dict");
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [name, v] : root->dict) {
    if (v->kind != Value::Tensor) throw InputError(path, name, "not a tensor");
    out.emplace_back(name, v->tensor.to(torch::kFloat32).contiguous());
  }
  return out;
}

}  // namespace kvscope::gates
