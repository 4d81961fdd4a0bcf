//! Exported kernel names, built by one rule on both sides: `dmattn_fwd_<elem>_d<head_dim>`, with
//! the variant's suffix (`modifiers::suffix`) appended.

pub const MASK_PACK: &str = "dmattn_mask_pack";
/// The mask pack for bits given packed: a thread per 64-key word.
pub const MASK_PACK_BITS: &str = "dmattn_mask_pack_bits";
/// The mask pack for key-side masks (one row a plane): a warp per 64-key word.
pub const MASK_PACK_KEYS: &str = "dmattn_mask_pack_keys";
pub const BLOCK_MASK: &str = "dmattn_block_mask";
/// A mask prepared per sequence laid out for a packed batch (`MaskSeqsParams`).
pub const MASK_TO_SEQS: &str = "dmattn_mask_to_seqs";
pub const KEY_COUNT: &str = "dmattn_key_count";
pub const KEY_COMPACT: &str = "dmattn_key_compact";
pub const GATHER_ROWS: &str = "dmattn_gather_rows";
pub const INDICES_BITS: &str = "dmattn_indices_bits";
/// Index lists to bits a row at a time in shared memory (rows of at most `INDICES_ROW_SMEM` bytes).
pub const INDICES_ROW_BITS: &str = "dmattn_indices_row_bits";
pub const GATHER_MASK: &str = "dmattn_gather_mask";
/// Key selection over 16-bit (bf16, f16) and 32-bit (f32) bias elements.
pub const SELECT_KEYS_16: &str = "dmattn_select_keys_16";
pub const SELECT_KEYS_32: &str = "dmattn_select_keys_32";
/// The wide key selection (many CTAs a row; `SelectWideParams`), over 16- and 32-bit elements.
pub const SELECT_WIDE_16: &str = "dmattn_select_wide_16";
pub const SELECT_WIDE_32: &str = "dmattn_select_wide_32";
/// `dmattn_scatter_rows_<elem>`.
pub const SCATTER_ROWS_PREFIX: &str = "dmattn_scatter_rows_";
pub const BWD_PREFIX: &str = "dmattn_bwd_";
/// The Hopper backward kernels (sm_90a module): `dmattn_bwd_sm90_<elem>_d<dim>[_mask|_bias|_mods]`.
pub const BWD_WGMMA_PREFIX: &str = "dmattn_bwd_sm90_";
/// Appended to a backward kernel's name for its deterministic variant, which adds dQ and
/// dBias in a fixed order (bit-identical runs) instead of with atomics.
pub const DETERMINISTIC_SUFFIX: &str = "_det";
/// Appended to a Hopper backward kernel's name (plain and `_mask` variants) for its variant
/// that takes any band ([`super::Band::needs_band_kernel`]): the others take only bands
/// without a left edge or compression, whose code then folds away (the backward's tiles are
/// at the register limit). Of the portable backward, the `_mods` variants take any band.
pub const BAND_SUFFIX: &str = "_band";
/// Appended last to a Hopper backward kernel's name for its variant that may walk a share of its
/// key tile's query tiles ([`super::bwd_split_kernel`]; the kernels of [`super::bwd_splits`]
/// head dims all may).
pub const SPLIT_SUFFIX: &str = "_split";
/// Appended to a forward kernel's modifier-variant name (`dmattn_fwd_<elem>_d<dim>_mods`)
/// for its gather-attention variant ([`super::FwdParams::key_ranks`]).
pub const GATHER_SUFFIX: &str = "_gather";
/// Appended to a forward kernel's modifier-variant name for its packed-batch variant
/// ([`super::Seqs`]; its own kernel: the sequences' loads in the fixed-length one spilled
/// it once the mask's origin moved per sequence).
pub const PACKED_SUFFIX: &str = "_packed";
/// Appended to a forward kernel's modifier-variant name for its paged-K/V variant
/// ([`super::Seqs::block_table`], a packed batch's; its own kernel, without mask tiles: a
/// branch in the modifier variants spilled them).
pub const PAGED_SUFFIX: &str = "_paged";
/// Appended to a Hopper forward kernel's modifier-variant name for its warp-specialised kernel
/// (the `mods_ws` tile) where the head dim also keeps the two-CTA one for fixed lengths
/// ([`super::fwd_sm90_two_cta_mods`]: d64, whose calls over few key tiles that one serves).
/// Elsewhere (d128) the warp-specialised kernel takes the modifier variant's name itself.
pub const WS_SUFFIX: &str = "_ws";
/// Appended to a gather variant's name for its narrow tile ([`super::FwdVariants::gather_narrow`]).
pub const NARROW_SUFFIX: &str = "_narrow";
/// The narrow gather variants (launch bounds, [`super::LAUNCH_BOUNDS`]).
pub const FWD_BF16_D64_GATHER_NARROW: &str = "dmattn_fwd_bf16_d64_mods_gather_narrow";
pub const FWD_F16_D64_GATHER_NARROW: &str = "dmattn_fwd_f16_d64_mods_gather_narrow";
pub const FWD_SM90_BF16_D64_GATHER_NARROW: &str = "dmattn_fwd_sm90_bf16_d64_mods_gather_narrow";
pub const FWD_SM90_F16_D64_GATHER_NARROW: &str = "dmattn_fwd_sm90_f16_d64_mods_gather_narrow";
pub const BWD_PRE_PREFIX: &str = "dmattn_bwd_pre_";
/// The backward's query-tile shares (`BwdSharesParams`).
pub const BWD_SHARES: &str = "dmattn_bwd_shares";
pub const CONVERT_PREFIX: &str = "dmattn_convert_";
/// `dmattn_convert_dq_<elem>`: dQ out of the Hopper backward's blocked accumulator
/// (`DqConvertParams`).
pub const CONVERT_DQ_PREFIX: &str = "dmattn_convert_dq_";
pub const COMBINE_PREFIX: &str = "dmattn_fwd_combine_";
/// `dmattn_combine_rows_<elem>`: the combine for calls of few rows, a CTA a row.
pub const COMBINE_ROWS_PREFIX: &str = "dmattn_combine_rows_";
/// `dmattn_decode_<elem>_d<dim>`, and its paged-K/V kernel with [`PAGED_SUFFIX`]: the
/// decoding forward ([`super::DecodeParams`]).
pub const DECODE_PREFIX: &str = "dmattn_decode_";
pub const FWD_PREFIX: &str = "dmattn_fwd_";
/// Per-query index lists laid out once, each row's keys ascending, off their bit mask
/// (`ListBitsParams`).
pub const LISTS_FROM_BITS: &str = "dmattn_lists_from_bits";
/// `dmattn_lists_fwd_<elem>_d<dim>[_mods]`: the forward over each query's listed keys (`_mods` with a bias or softcap)
/// (`ListsParams`).
pub const LISTS_FWD_PREFIX: &str = "dmattn_lists_fwd_";
/// `dmattn_fwd_sm90_<elem>_d<dim>[_mods[_gather[_narrow]|_packed|_paged]]`: the Hopper forward
/// ([`super::FWD_TILES_SM90`]).
pub const FWD_WGMMA_PREFIX: &str = "dmattn_fwd_sm90_";
/// Writes a bulk-copy forward's tensor maps ([`super::TensorMapsParams`]; sm_90a module).
pub const STORE_TENSOR_MAPS: &str = "dmattn_store_tensor_maps";
/// `dmattn_fwd_order_d<dim>`: the work order of that head dim's modifier variant.
pub const FWD_ORDER_PREFIX: &str = "dmattn_fwd_order_d";
/// `dmattn_bwd_order_n<block_n>`: the work order of a backward with that key tile.
pub const BWD_ORDER_PREFIX: &str = "dmattn_bwd_order_n";
/// `dmattn_softmax_rows_<elem>`: the materialising path's row softmax.
pub const SOFTMAX_ROWS_PREFIX: &str = "dmattn_softmax_rows_";
