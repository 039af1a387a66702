// The field tables of the structs that cross into the front ends (for_each_field in report.h,
// info.h, encoded.h, object_storage.h, video.h; Stats' for_each_stat is checked in stats.cc) must
// name every member: a structured binding needs exactly as many names as the struct has members, so
// adding a member without adding it to its table fails to compile here (the Python tests then
// check that each dict has the table's keys: tests/python/test_loader.py).
#include "stoker/encoded.h"
#include "stoker/info.h"
#include "stoker/object_storage.h"
#include "stoker/report.h"
#include "stoker/video.h"

namespace stoker {
namespace {

[[maybe_unused]] void check_tables_cover_structs(const Report& r, const CudaInfo& c,
                                                 const PackResult& p,
                                                 const EncodedSource::Counters& s,
                                                 const ObjectStorageCounters& o,
                                                 const VideoClips::Counters& v) {
  [[maybe_unused]] const auto& [r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15,
                                r16, r17, r18, r19, r20, r21, r22, r23, r24] = r;
  [[maybe_unused]] const auto& [c1, c2, c3, c4, c5, c6] = c;
  [[maybe_unused]] const auto& [p1, p2, p3, p4] = p;
  [[maybe_unused]] const auto& [s1, s2, s3, s4, s5] = s;
  [[maybe_unused]] const auto& [o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14] = o;
  [[maybe_unused]] const auto& [v1, v2, v3, v4, v5, v6] = v;
}

}  // namespace
}  // namespace stoker
