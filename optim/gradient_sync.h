// The interface through which the Window talks to data parallelism. optim
// defines it and dist implements it (optim never includes dist).
#pragma once

#include <functional>
#include <vector>

#include "accrue/autograd/grad_arena.h"
#include "accrue/core/tensor.h"

namespace accrue::optim {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Before the backward of micro-step `index` (0-based) of a window of
  // `micro_steps`. Note [Buckets]: only the last one communicates.
  virtual void before_backward(int64_t index, int64_t micro_steps) = 0;
  // At close, before the norm pass: the gradient arena must be reduced (under
  // ZeRO-1, in the owned ranges only) and `items` (a 0-d f64 device tensor,
  // this rank's N) summed over ranks, both ordered before the current
  // stream's next work. No host synchronization.
  virtual void finish(const Tensor& items) = 0;
  // Ranks whose gradients the reduction sums (the legacy mean-of-means mode divides by K x this).
  virtual int64_t world_size() const { return 1; }
  // Throws the error that ended a collective (a peer died and the
  // communicator was aborted); otherwise nothing. Window::report() calls it
  // after its host read: an abort unblocks the streams with the reductions
  // cut short, so a window closed over them holds undefined weights and must
  // neither be reported nor saved.
  virtual void check() {}

  // Note [ZeRO-1] (dist/reducer.h). The ranges of the arena whose reduced
  // gradient this rank holds after finish() and whose parameters it steps,
  // in order; its optimizer moments hold exactly these ranges, packed in this
  // order (ParamStore::shard_moments). Empty: plain data parallelism, every
  // rank holds and steps the whole arena, and the gathers below are unused.
  virtual const std::vector<ArenaRange>& owned_ranges() const {
    static const std::vector<ArenaRange> whole_arena;
    return whole_arena;
  }

  // Plain collectives over the ranks, stream-ordered (ordered after the
  // current stream's work so far, and before its next), never synchronizing
  // the host. The close's stages use them (Note [Close stages]).
  //
  // `values` (1-D f64 on the device) becomes its elementwise max over ranks:
  // the written flags of Note [Unused parameters] (a parameter any rank wrote
  // is used), the f16 maxima of Note [Scale calibration]. The default serves
  // a world of one rank, where the values are already the world's.
  virtual void all_reduce_max(const Tensor& values);
  // `values` (0-d or 1-D f64 on the device) becomes its elementwise sum over
  // ranks: the window's loss sum, so that the report's loss is the world's
  // mean (Note [Normalization]). The default serves a world of one rank.
  virtual void all_reduce_sum(const Tensor& values);
  // `local` from every rank into `all` ([world_size() * local rows, ...],
  // rank order), identical on every rank: the norm partials under ZeRO-1, so
  // that all ranks agree on the norm and on found_inf.
  virtual void all_gather(const Tensor& local, const Tensor& all);
  // Every owned range of the flat arena `flat` (the forward's weights: the
  // compute copy, else the master) from the rank that owns it (Note [ZeRO-1]).
  virtual void all_gather_owned(const Tensor& flat);

  // Note [Norm under the backward] (optim/norm_rows.h), under data
  // parallelism. The sync calls `listener` right after it issues, during the
  // last micro-step's backward, the reduction of one bucket, with the range
  // of the arena that this reduction makes final on this rank (plain: the
  // bucket; ZeRO-1: this rank's chunk of it) and with the current stream set
  // so that work ordered after the current stream's work so far reads the
  // reduced values. Buckets reduced at finish() are not reported. An empty
  // listener stops the calls. Returns false when this sync cannot report (the
  // default, and a 16-bit transport, whose sums reach the arena only at
  // finish()): the norm pass then stays at the close.
  virtual bool set_reduced_listener(std::function<void(const ArenaRange&)> listener);
};

}  // namespace accrue::optim
