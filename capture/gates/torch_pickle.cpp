#include "capture/gates/torch_pickle.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
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
  int depth = 0;        // nesting of containers below this value
  bool sealed = false;  // an item of another value: never mutated again (no cycles)
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

// Bounds on what a pickle may build. torch.save of a dict of tensors nests
// a few levels (dict > tensor > args tuple > size tuple); a deeper value is
// not such a file, and freeing a deep chain of shared_ptrs recurses once per
// level. Memo ids count the values the pickle put there, so an id beyond the
// pickle's own size is never one it set.
constexpr int kMaxDepth = 32;

class Unpickler {
 public:
  Unpickler(std::string file, const std::string& bytes, caffe2::serialize::PyTorchStreamReader& zip,
            uint64_t max_tensor_bytes)
      : file_(std::move(file)), b_(bytes), zip_(zip), budget_(max_tensor_bytes) {}

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
    if (id > b_.size())
      fail("memo id " + std::to_string(id) + " is beyond what a " + std::to_string(b_.size()) +
           "-byte pickle can have set");
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
  // `item` becomes part of `container`: sealed, and the nesting checked.
  // A container not yet inside another value is inside nothing, so only
  // itself could close a cycle.
  void adopt(Value& container, const VP& item) {
    if (item->kind == Value::Mark) fail("MARK inside a container");
    if (item.get() == &container) fail("a container inside itself (recursive values are not read)");
    item->sealed = true;
    container.depth = std::max(container.depth, item->depth + 1);
    if (container.depth > kMaxDepth)
      fail("values nested deeper than " + std::to_string(kMaxDepth) +
           " levels (a dict of tensors nests a few)");
  }
  void tuple(std::vector<VP> items) {
    VP v = make(Value::Tuple);
    for (const VP& it : items) adopt(*v, it);
    v->items = std::move(items);
    push(v);
  }
  void append(std::vector<VP> items) {
    VP list = pop();
    if (list->kind != Value::List) fail("APPEND to a non-list");
    if (list->sealed)
      fail("APPEND to a list already inside another value (recursive lists are not read)");
    for (VP& it : items) {
      adopt(*list, it);
      list->items.push_back(it);
    }
    push(list);
  }
  void set_items(std::vector<VP> kv) {
    VP d = pop();
    if (d->kind != Value::Dict) fail("SETITEM on a non-dict");
    if (d->sealed)
      fail("SETITEM on a dict already inside another value (recursive dicts are not read)");
    if (kv.size() % 2) fail("SETITEMS with an odd number of values");
    for (size_t k = 0; k < kv.size(); k += 2) {
      if (kv[k]->kind != Value::Str) fail("a dict key that is not a string");
      adopt(*d, kv[k + 1]);
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
  // Non-negative integers of a size or stride tuple (at most 8 of them).
  std::vector<int64_t> ints(const VP& t, const char* what) const {
    if (t->items.size() > 8) fail(std::string("tensor ") + what + " of more than 8 dimensions");
    std::vector<int64_t> out;
    for (const VP& x : t->items) {
      if (x->kind != Value::Int || x->i < 0)
        fail(std::string("tensor ") + what + " holds something other than a non-negative integer");
      out.push_back(x->i);
    }
    return out;
  }
  // A storage record, read once however many tensors view it.
  const torch::Tensor& storage(const Value& s) {
    const std::string record = "data/" + s.s;
    auto it = storages_.find(record);
    if (it != storages_.end()) return it->second;
    if (!zip_.hasRecord(record)) fail("missing storage record " + record);
    auto [ptr, nbytes] = zip_.getRecord(record);
    const int64_t elem = int64_t(c10::elementSize(s.dtype));
    torch::Tensor flat =
        torch::from_blob(ptr.get(), {int64_t(nbytes) / elem}, torch::TensorOptions().dtype(s.dtype))
            .clone();
    return storages_.emplace(record, flat).first->second;
  }
  torch::Tensor rebuild_tensor(const std::vector<VP>& a) {
    if (a.size() < 4 || a[0]->kind != Value::Storage || a[1]->kind != Value::Int ||
        a[2]->kind != Value::Tuple || a[3]->kind != Value::Tuple)
      fail("unexpected _rebuild_tensor_v2 arguments");
    const torch::Tensor& flat = storage(*a[0]);
    std::vector<int64_t> size = ints(a[2], "size"), stride = ints(a[3], "stride");
    if (size.size() != stride.size()) fail("tensor size and stride of different lengths");
    // The last element the view reaches, without overflow: every size and
    // stride is checked against the storage before it is multiplied.
    const int64_t offset = a[1]->i, n = flat.numel();
    const auto outside = [&] { fail("tensor view outside its storage (data/" + a[0]->s + ")"); };
    if (offset < 0 || offset > n) outside();
    bool empty = false;
    for (int64_t d : size) empty |= d == 0;
    int64_t last = offset;
    for (size_t d = 0; d < size.size() && !empty; ++d) {
      if (size[d] > 1 && stride[d] > (n - last) / (size[d] - 1)) outside();
      last += (size[d] - 1) * stride[d];
    }
    if (!empty && last >= n) outside();
    int64_t numel = 1;
    for (int64_t d : size)
      if (__builtin_mul_overflow(numel, d, &numel)) fail("tensor element count overflows");
    // Views may overlap (the same storage shared or re-read), so what is
    // materialised is bounded by the archive, not by each view.
    const uint64_t bytes = uint64_t(numel) * 4;  // copies are converted to float32
    if (bytes > budget_)
      fail("the tensors' views add up to more than " + std::to_string(budget_) +
           " bytes, far more than the archive's storages hold");
    budget_ -= bytes;
    return flat.as_strided(size, stride, offset).contiguous();
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
  std::map<std::string, torch::Tensor> storages_;
  uint64_t budget_;  // float32 bytes tensors may still materialise
};

}  // namespace

bool looks_like_torch_save(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "PK\x03\x04", 4) == 0;
}

namespace {

uint64_t le_at(const std::string& b, size_t pos, int n) {
  uint64_t v = 0;
  for (int k = 0; k < n; ++k) v |= uint64_t(uint8_t(b[pos + size_t(k)])) << (8 * k);
  return v;
}

// LibTorch's zip reader allocates each record at the size the central
// directory declares before it reads a byte of it, so a 1 KB archive can
// ask for 4 GB. This walks the central directory first (zip64 too) and
// refuses a record larger than the archive could hold: torch.save stores
// records uncompressed, and deflate expands at most 1032:1. A directory it
// cannot find is left to the zip reader to report.
void check_record_sizes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const uint64_t size = b.size();
  if (size < 22) return;
  size_t eocd = std::string::npos;
  for (size_t p = size - 22;; --p) {  // the end record, before a comment of <= 64 KiB
    if (le_at(b, p, 4) == 0x06054b50) {
      eocd = p;
      break;
    }
    if (p == 0 || size - p > 22 + 65535) break;
  }
  if (eocd == std::string::npos) return;
  uint64_t entries = le_at(b, eocd + 10, 2), dir = le_at(b, eocd + 16, 4);
  if ((entries == 0xFFFF || dir == 0xFFFFFFFF) && eocd >= 20 &&
      le_at(b, eocd - 20, 4) == 0x07064b50) {  // zip64 locator, then the zip64 end record
    const uint64_t z = le_at(b, eocd - 20 + 8, 8);
    if (z > size || size - z < 56 || le_at(b, size_t(z), 4) != 0x06064b50) return;
    entries = le_at(b, size_t(z) + 32, 8);
    dir = le_at(b, size_t(z) + 48, 8);
  }
  uint64_t p = dir;
  for (uint64_t e = 0; e < entries; ++e) {
    if (p > size || size - p < 46 || le_at(b, size_t(p), 4) != 0x02014b50) return;
    const uint64_t method = le_at(b, size_t(p) + 10, 2);
    uint64_t packed = le_at(b, size_t(p) + 20, 4), unpacked = le_at(b, size_t(p) + 24, 4);
    const uint64_t name_len = le_at(b, size_t(p) + 28, 2), extra_len = le_at(b, size_t(p) + 30, 2),
                   comment_len = le_at(b, size_t(p) + 32, 2);
    const uint64_t next = p + 46 + name_len + extra_len + comment_len;
    if (next > size) return;
    const std::string name = b.substr(size_t(p) + 46, size_t(name_len));
    // zip64 extended information: the 64-bit sizes of the fields saturated above.
    for (uint64_t x = p + 46 + name_len; x + 4 <= p + 46 + name_len + extra_len;) {
      const uint64_t id = le_at(b, size_t(x), 2), len = le_at(b, size_t(x) + 2, 2);
      if (x + 4 + len > p + 46 + name_len + extra_len) break;
      if (id == 0x0001) {
        uint64_t f = x + 4;
        if (unpacked == 0xFFFFFFFF && len >= f - x - 4 + 8)
          unpacked = le_at(b, size_t(f), 8), f += 8;
        if (packed == 0xFFFFFFFF && len >= f - x - 4 + 8) packed = le_at(b, size_t(f), 8);
      }
      x += 4 + len;
    }
    const uint64_t limit = method == 0 ? size : std::min(size, packed) * 1032;
    if (unpacked > limit)
      throw InputError(path, name,
                       "the zip directory declares " + std::to_string(unpacked) +
                           " bytes for this record, more than a " + std::to_string(size) +
                           "-byte archive can hold (truncated or corrupt archive)");
    p = next;
  }
}

std::vector<std::pair<std::string, torch::Tensor>> read_archive(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw InputError(path, "", "cannot open");
  const uint64_t file_bytes = uint64_t(in.tellg());
  if (!looks_like_torch_save(path))
    throw InputError(path, "", "not a torch.save zip archive (legacy pre-1.6 archives are not read)");
  check_record_sizes(path);
  auto zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  if (zip->hasRecord("byteorder")) {
    auto [p, n] = zip->getRecord("byteorder");
    if (std::string(static_cast<const char*>(p.get()), n) != "little")
      throw InputError(path, "byteorder", "only little-endian archives are read");
  }
  if (!zip->hasRecord("data.pkl")) throw InputError(path, "data.pkl", "missing");
  auto [ptr, n] = zip->getRecord("data.pkl");
  const std::string pkl(static_cast<const char*>(ptr.get()), n);
  // Tensors become float32 copies: 4 bytes per element of any storage
  // (bool and int8 grow 4x); shared storages are viewed a few times at most.
  VP root = Unpickler(path, pkl, *zip, 16 * file_bytes + (uint64_t(1) << 20)).run();
  if (root->kind != Value::Dict) throw InputError(path, "data.pkl", "the archive does not hold a dict");
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [name, v] : root->dict) {
    if (v->kind != Value::Tensor) throw InputError(path, name, "not a tensor");
    out.emplace_back(name, v->tensor.to(torch::kFloat32).contiguous());
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> read_torch_save(const std::string& path) {
  // LibTorch's zip reader reports a damaged archive with c10::Error, which
  // is bad input here like any other.
  try {
    return read_archive(path);
  } catch (const InputError&) {
    throw;
  } catch (const c10::Error& e) {
    throw InputError(path, "",
                     std::string("unreadable torch.save archive: ") + e.what_without_backtrace());
  }
}

}  // namespace kvscope::gates
