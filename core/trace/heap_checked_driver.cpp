#include "core/trace/heap_checked_driver.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace kvscope::trace::h5 {

namespace {

// ---- the collection check -------------------------------------------------

uint64_t decode_le(const uint8_t* p, unsigned bytes) {
  uint64_t v = 0;
  for (unsigned i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

}  // namespace

bool global_heap_image_ok(const uint8_t* image, size_t size, unsigned length_bytes) {
  const size_t header = 8 + length_bytes;         // "GCOL", version, 3 reserved, collection size
  const size_t object_header = 8 + length_bytes;  // index, refs, 4 reserved, object size
  if (size < header || std::memcmp(image, "GCOL", 4) != 0 || image[4] != 1) return false;
  const uint64_t collection = decode_le(image + 8, length_bytes);
  if (collection < header) return false;
  if (size < collection) return true;  // HDF5's speculative first read: it re-reads the whole
  const uint8_t* end = image + collection;
  const uint8_t* p = image + header;
  // The walk HDF5's deserializer makes (H5HGcache.c), with the bounds it
  // leaves to assertions: every object must fit, and free space (index 0)
  // must advance, or HDF5 would loop forever.
  while (p < end) {
    const size_t left = static_cast<size_t>(end - p);
    if (left < object_header) break;  // a tail too small for an object is free space
    const uint64_t index = decode_le(p, 2);
    const uint64_t object_size = decode_le(p + 8, length_bytes);
    uint64_t need = 0;
    if (index == 0) {
      need = object_size;  // free space: its size includes its header
      if (need < object_header || need > left) return false;
    } else {
      if (object_size > left - object_header) return false;
      need = object_header + ((object_size + 7) & ~uint64_t(7));
      if (need > left) return false;
    }
    p += need;
  }
  return true;
}

namespace {

// ---- the driver -------------------------------------------------------------
//
// Plain POSIX reads (as HDF5's sec2 driver does them). It does not forward to
// sec2 through the H5FD* API: every public HDF5 call clears the error stack,
// which would erase HDF5's own reasons (e.g. "file is already open for write").

struct CheckedFile {
  H5FD_t pub;  // must be first: HDF5 owns and fills it
  int fd;      // -1 for a memory image
  dev_t device;
  ino_t inode;
  haddr_t eoa;
  haddr_t eof;
  unsigned length_bytes;
  const uint8_t* image;  // a file image in memory (checked_image_fapl), or nullptr
};

// What checked_image_fapl hands the driver through the property list.
struct ImageInfo {
  const uint8_t* data;
  size_t size;
};

CheckedFile* self(H5FD_t* f) {
  return reinterpret_cast<CheckedFile*>(f);
}
const CheckedFile* self(const H5FD_t* f) {
  return reinterpret_cast<const CheckedFile*>(f);
}

void push_error(H5E_minor_t minor, const std::string& what) {
  H5Epush2(H5E_DEFAULT, __FILE__, "kvscope_heap_checked", __LINE__, H5E_ERR_CLS, H5E_VFL, minor,
           "%s", what.c_str());
}

bool read_fully(int fd, void* buf, size_t size, off_t at) {
  auto* p = static_cast<uint8_t*>(buf);
  while (size > 0) {
    ssize_t n = pread(fd, p, size, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
    at += n;
  }
  return true;
}

// The superblock's sizes of offsets and lengths (signature at 0, 512, 1024,
// ...). HDF5 accepts up to 32-byte addresses and sizes and then allocates by
// what it decodes with them: a flipped bit there made it ask for gigabytes
// (found by fuzzing). Every file HDF5 writes uses 8 (4 and 2 exist in old
// files), so anything else is refused; no signature is HDF5's to report.
struct SuperblockSizes {
  bool found = false;
  unsigned offsets = 8, lengths = 8;
};

// Reads [at, at + size) of the file or its image.
bool read_at(const CheckedFile* f, void* buf, size_t size, haddr_t at) {
  if (!f->image) return read_fully(f->fd, buf, size, static_cast<off_t>(at));
  if (at > f->eof || size > f->eof - at) return false;
  std::memcpy(buf, f->image + at, size);
  return true;
}

SuperblockSizes read_superblock_sizes(const CheckedFile* f) {
  static const uint8_t kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  SuperblockSizes out;
  for (haddr_t at = 0; at + 16 <= f->eof; at = at == 0 ? 512 : at * 2) {
    uint8_t sb[16];
    if (!read_at(f, sb, sizeof sb, at)) break;
    if (std::memcmp(sb, kSignature, 8) != 0) continue;
    const bool v01 = sb[8] <= 1;  // superblock v0/1 vs v2/3 layout
    out.found = true;
    out.offsets = v01 ? sb[13] : sb[9];
    out.lengths = v01 ? sb[14] : sb[10];
    return out;
  }
  return out;
}

bool plausible_size(unsigned bytes) {
  return bytes == 2 || bytes == 4 || bytes == 8;
}

// The file (or image), checked for what HDF5 would allocate by: the
// superblock's sizes of offsets and lengths.
H5FD_t* checked_file(CheckedFile* f) {
  const SuperblockSizes sizes = read_superblock_sizes(f);
  if (sizes.found && !(plausible_size(sizes.offsets) && plausible_size(sizes.lengths))) {
    push_error(H5E_BADVALUE, "damaged superblock: sizes of offsets " +
                                 std::to_string(sizes.offsets) + " and lengths " +
                                 std::to_string(sizes.lengths) + " bytes (expected 2, 4 or 8)");
    if (f->fd >= 0) ::close(f->fd);
    std::free(f);
    return nullptr;
  }
  f->length_bytes = sizes.lengths;
  return &f->pub;
}

bool refuse_writing(unsigned flags) {
  if (!(flags & (H5F_ACC_RDWR | H5F_ACC_TRUNC | H5F_ACC_CREAT))) return false;
  push_error(H5E_CANTOPENFILE, "the heap-checked driver only reads");
  return true;
}

H5FD_t* checked_open_image(const char*, unsigned flags, hid_t fapl, haddr_t) {
  if (refuse_writing(flags)) return nullptr;
  const auto* image = static_cast<const ImageInfo*>(H5Pget_driver_info(fapl));
  if (!image || !image->data) return nullptr;
  auto* f = static_cast<CheckedFile*>(std::calloc(1, sizeof(CheckedFile)));
  if (!f) return nullptr;
  f->fd = -1;
  f->image = image->data;
  f->eof = static_cast<haddr_t>(image->size);
  return checked_file(f);
}

H5FD_t* checked_open(const char* name, unsigned flags, hid_t, haddr_t) {
  if (refuse_writing(flags)) return nullptr;
  int fd = ::open(name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    push_error(H5E_CANTOPENFILE, std::string("unable to open file: ") + std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    push_error(H5E_CANTOPENFILE, std::string("unable to stat file: ") + std::strerror(errno));
    ::close(fd);
    return nullptr;
  }
  auto* f = static_cast<CheckedFile*>(std::calloc(1, sizeof(CheckedFile)));
  if (!f) {
    ::close(fd);
    return nullptr;
  }
  f->fd = fd;
  f->device = st.st_dev;
  f->inode = st.st_ino;
  f->eof = static_cast<haddr_t>(st.st_size);
  return checked_file(f);
}

herr_t checked_close(H5FD_t* file) {
  const int r = self(file)->fd >= 0 ? ::close(self(file)->fd) : 0;
  std::free(self(file));
  return r == 0 ? 0 : -1;
}

int checked_cmp(const H5FD_t* a, const H5FD_t* b) {
  const CheckedFile* x = self(a);
  const CheckedFile* y = self(b);
  // Images are the same file when they are the same bytes.
  if (x->image != y->image) return x->image < y->image ? -1 : 1;
  if (x->image && x->eof != y->eof) return x->eof < y->eof ? -1 : 1;
  if (x->device != y->device) return x->device < y->device ? -1 : 1;
  if (x->inode != y->inode) return x->inode < y->inode ? -1 : 1;
  return 0;
}

herr_t checked_query(const H5FD_t* file, unsigned long* flags) {
  // sec2's features but the metadata accumulator: without it each global
  // heap read reaches read() whole instead of inside a larger merged block.
  // An image has no POSIX handle (HDF5 would resolve its name as a path).
  if (flags)
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_AGGREGATE_SMALLDATA |
             H5FD_FEAT_SUPPORTS_SWMR_IO |
             (file && self(file)->image ? 0 : H5FD_FEAT_POSIX_COMPAT_HANDLE);
  return 0;
}

haddr_t checked_get_eoa(const H5FD_t* file, H5FD_mem_t) {
  return self(file)->eoa;
}
herr_t checked_set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  self(file)->eoa = addr;
  return 0;
}
haddr_t checked_get_eof(const H5FD_t* file, H5FD_mem_t) {
  // A file followed while a writer appends grows: ask the system each time.
  if (self(file)->image) return self(file)->eof;
  struct stat st {};
  if (fstat(self(file)->fd, &st) == 0) return static_cast<haddr_t>(st.st_size);
  return self(file)->eof;
}
herr_t checked_get_handle(H5FD_t* file, hid_t, void** handle) {
  *handle = &self(file)->fd;
  return 0;
}

// "GCOL", version 1, three zero bytes: a global heap collection header (raw
// data that starts so and then fails the walk is refused too; only a file
// built to do so has such data).
bool looks_like_collection(const uint8_t* p, size_t size) {
  return size >= 8 && std::memcmp(p, "GCOL", 4) == 0 && p[4] == 1 && p[5] == 0 && p[6] == 0 &&
         p[7] == 0;
}

herr_t checked_read(H5FD_t* file, H5FD_mem_t type, hid_t, haddr_t addr, size_t size, void* buf) {
  CheckedFile* f = self(file);
  // HDF5 checks reads against the allocated end itself, except in SWMR-read
  // mode, where objects a writer appends lie past the end the superblock
  // last recorded (H5FD_read).
  if (addr == HADDR_UNDEF || addr + size < addr) {
    push_error(H5E_OVERFLOW, "read of " + std::to_string(size) + " bytes at address " +
                                 std::to_string(addr) + " overflows");
    return -1;
  }
  // Past the end of the file reads zeros, as sec2 does.
  const haddr_t eof = checked_get_eof(file, type);
  const size_t have = addr >= eof ? 0 : static_cast<size_t>(std::min<haddr_t>(size, eof - addr));
  if (have > 0 && !read_at(f, buf, have, addr)) {
    push_error(H5E_READERROR, std::string("read failed: ") + std::strerror(errno));
    return -1;
  }
  std::memset(static_cast<uint8_t*>(buf) + have, 0, size - have);
  // HDF5 hands global heap reads to drivers as raw data (H5F_block_read maps
  // GHEAP to DRAW), so a collection is recognised by its header.
  const auto* image = static_cast<const uint8_t*>(buf);
  if ((type == H5FD_MEM_GHEAP || type == H5FD_MEM_DRAW) && looks_like_collection(image, size) &&
      !global_heap_image_ok(image, size, f->length_bytes)) {
    push_error(H5E_READERROR, "damaged global heap collection at address " + std::to_string(addr) +
                                  " (an object does not fit inside it)");
    return -1;
  }
  return 0;
}

herr_t checked_write(H5FD_t*, H5FD_mem_t, hid_t, haddr_t, size_t, const void*) {
  push_error(H5E_WRITEERROR, "the heap-checked driver only reads");
  return -1;
}

herr_t checked_lock(H5FD_t* file, hbool_t rw) {
  if (self(file)->image) return 0;
  if (flock(self(file)->fd, (rw ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0 || errno == ENOSYS) return 0;
  push_error(H5E_CANTLOCKFILE, std::string("unable to lock file: ") + std::strerror(errno));
  return -1;
}
herr_t checked_unlock(H5FD_t* file) {
  if (self(file)->image) return 0;
  if (flock(self(file)->fd, LOCK_UN) == 0 || errno == ENOSYS) return 0;
  push_error(H5E_CANTUNLOCKFILE, std::string("unable to unlock file: ") + std::strerror(errno));
  return -1;
}

// The driver of files (image false) or of file images in memory: the same
// checks, reads from a descriptor or from memory.
hid_t driver_id(bool image) {
  static hid_t ids[2] = {-1, -1};
  static std::once_flag once;
  std::call_once(once, [] {
    for (int kind = 0; kind < 2; ++kind) {
      static H5FD_class_t classes[2];
      H5FD_class_t& cls = classes[kind];
      std::memset(&cls, 0, sizeof cls);
      cls.name = kind ? "kvscope_heap_checked_image" : "kvscope_heap_checked";
      cls.maxaddr = static_cast<haddr_t>(INT64_MAX);
      cls.fc_degree = H5F_CLOSE_WEAK;
      cls.fapl_size = kind ? sizeof(ImageInfo) : 0;
      cls.open = kind ? checked_open_image : checked_open;
      cls.close = checked_close;
      cls.cmp = checked_cmp;
      cls.query = checked_query;
      cls.get_eoa = checked_get_eoa;
      cls.set_eoa = checked_set_eoa;
      cls.get_eof = checked_get_eof;
      cls.get_handle = checked_get_handle;
      cls.read = checked_read;
      cls.write = checked_write;
      cls.lock = checked_lock;
      cls.unlock = checked_unlock;
      const H5FD_mem_t dichotomy[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
      std::memcpy(cls.fl_map, dichotomy, sizeof dichotomy);
      ids[kind] = H5FDregister(&cls);
    }
  });
  return ids[image ? 1 : 0];
}

}  // namespace

hid_t checked_read_fapl() {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl >= 0 && H5Pset_driver(fapl, driver_id(false), nullptr) < 0) {
    H5Pclose(fapl);
    return -1;
  }
  return fapl;
}

hid_t checked_image_fapl(const void* data, size_t size) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  const ImageInfo info{static_cast<const uint8_t*>(data), size};
  if (fapl >= 0 && H5Pset_driver(fapl, driver_id(true), &info) < 0) {
    H5Pclose(fapl);
    return -1;
  }
  return fapl;
}

}  // namespace kvscope::trace::h5
