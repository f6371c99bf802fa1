/* The compiled scanner's interface (ckptfs/pickle/_cscan.c), mirrored by ctypes in ckptfs/pickle/cscan.py. */
#ifndef CKPTFS_CSCAN_H
#define CKPTFS_CSCAN_H
#include <stdint.h>

#define CS_DONE 0
#define CS_REFUSED 1

/* Rows of int64, in the order the reference interpreter makes them:
 *   storages (8 per row, one per persistent load): class name offset, length, key offset, length, location
 *       offset, length, numel, the key's number (its value where it is decimal without leading zeros, at most
 *       18 digits; else -1)
 *   tensors (8 per row, one per _rebuild_tensor_v2 call): storage row, storage offset, size's pool offset, rank,
 *       stride's pool offset, requires_grad, whether it has elements, index of its last element
 *   items (3 per row, one per key and value set in the root dict): key offset, key length, tensor row
 *   pool: the sizes' and strides' items
 * Offsets are into the pickle's bytes; strings are undecoded. */
typedef struct {
    int64_t end; /* where the scan stopped: after STOP, or at the opcode it refused */
    int64_t *pool;
    int64_t pool_len;
    int64_t *storages;
    int64_t storage_rows;
    int64_t *tensors;
    int64_t tensor_rows;
    int64_t *items;
    int64_t item_rows;
} cs_result;

int cs_scan(const uint8_t *data, int64_t len, int64_t max_memo, int64_t max_depth, cs_result *out);
void cs_free(cs_result *result);

/* A zip central directory of count entries (_cscan_zip.c): per entry, into rows (count * CS_DIRECTORY_FIELDS,
 * the caller's), its name's offset and length, method, flags, compressed and uncompressed sizes, local header
 * offset and CRC-32; in_order: whether the header offsets increase. */
#define CS_DIRECTORY_FIELDS 8
int cs_directory(const uint8_t *dir, int64_t size, int64_t count, int64_t cd_offset, int64_t *rows,
                 int64_t *in_order);
/* Of cs_directory's rows: the number n of each "<prefix>data/<n>" (the prefix the first name's up to its first
 * slash, n canonical decimal below count), -1 for other names, and each number's row (-1 where none); returns how
 * many rows have a number, or -1 where two have the same one or the first name has no prefix. */
int64_t cs_directory_keys(const uint8_t *dir, const int64_t *rows, int64_t count, int64_t *number_of_row,
                          int64_t *row_of_number);
/* Of rows in header offset order: each record's data offset by torch's alignment rule (spec 1.6) where its space
 * up to the next record (cd_offset after the last) holds exactly the predicted local header and the data (and a
 * data descriptor where flag 8 says), else -1. alignment > 0. */
void cs_data_offsets(const int64_t *rows, int64_t count, int64_t cd_offset, int64_t alignment, int64_t *data_offset);

/* A torch.distributed.checkpoint .metadata pickle (_cscan_dcp.c): tables of int64 rows, each CS_DCP_<TABLE>
 * ints wide, in the order the pickle sets them; offsets are into the pickle's bytes, strings undecoded ASCII.
 *   header (one row): version's offset and length (-1, -1 unless a str), planner_data: 1 a dict, 0 None or absent,
 *       whether the direct rows are made (_cscan_dcp_join.c: not when an item is there twice)
 *   items: key offset, length, tensor row (-1: a BytesStorageMetadata)
 *   tensors: dtype name offset, length (torch.<name>), requires_grad, size's pool offset, rank, first chunk row,
 *       chunks
 *   chunks: offsets' pool offset, rank, sizes' pool offset, rank
 *   planner: key offset, length, first path row, path rows
 *   paths: 0 and a str's offset and length, or 1, an int and 0
 *   storage: fqn offset, length, offset's pool offset (-1: None), its rank, relative_path offset, length, byte
 *       offset, length
 *   pool: the sizes' and offsets' items
 *   direct (one row per item, in the items' order): the item's key offset and length, then for a tensor of one
 *       chunk of its size whose planner path is one str (or none) and whose chunk is in storage_data: that str's
 *       offset and length (the key's without a path), dtype row, requires_grad, size's and offsets' shape rows,
 *       the storage entry's file row, byte offset and length; for any other item -1 and 0s
 *   shapes: the distinct tuples of the direct rows, each its pool offset and rank
 *   files: the distinct relative_paths of storage_data's entries (a key's last), each its offset and length
 *   dtypes: the distinct dtype names of the tensors, each its offset and length */
enum { CS_DCP_HEADER, CS_DCP_ITEMS, CS_DCP_TENSORS, CS_DCP_CHUNKS, CS_DCP_PLANNER, CS_DCP_PATHS, CS_DCP_STORAGE,
       CS_DCP_POOL, CS_DCP_DIRECT, CS_DCP_SHAPES, CS_DCP_FILES, CS_DCP_DTYPES, CS_DCP_TABLES };
#define CS_DCP_DIRECT_FIELDS 11
#define CS_DCP_WIDTHS {4, 3, 7, 4, 4, 3, 8, 1, CS_DCP_DIRECT_FIELDS, 2, 2, 2}
typedef struct {
    int64_t end;
    int64_t *tables[CS_DCP_TABLES];
    int64_t lens[CS_DCP_TABLES]; /* int64s in each */
} cs_dcp_result;

int cs_dcp(const uint8_t *data, int64_t len, int64_t max_memo, int64_t max_depth, cs_dcp_result *out);
void cs_dcp_free(cs_dcp_result *result);
#endif
