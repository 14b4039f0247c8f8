# Enforces the dependency rules of docs/architecture.md on the link graph:
# kvscope_forbid_links(target "pattern;pattern") fails configuration when the
# target links, directly or through another target, anything whose name
# contains one of the patterns. Checked after every target exists.

function(_kvscope_collect_links target out_var)
  set(seen "")
  set(queue ${target})
  while(queue)
    list(POP_FRONT queue item)
    if(item IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${item})
    if(TARGET ${item})
      get_target_property(aliased ${item} ALIASED_TARGET)
      if(aliased)
        list(APPEND queue ${aliased})
      endif()
      get_target_property(type ${item} TYPE)
      set(props INTERFACE_LINK_LIBRARIES)
      if(NOT type STREQUAL "INTERFACE_LIBRARY")
        list(APPEND props LINK_LIBRARIES)
      endif()
      foreach(prop ${props})
        get_target_property(libs ${item} ${prop})
        if(libs)
          foreach(lib ${libs})
            string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" lib "${lib}")
            if(NOT lib MATCHES "^\\$<")
              list(APPEND queue ${lib})
            endif()
          endforeach()
        endif()
      endforeach()
    endif()
  endwhile()
  set(${out_var} ${seen} PARENT_SCOPE)
endfunction()

function(kvscope_forbid_links target patterns)
  _kvscope_collect_links(${target} links)
  foreach(lib ${links})
    get_filename_component(name "${lib}" NAME)
    foreach(pattern ${patterns})
      string(FIND "${name}" "${pattern}" pos)
      if(pos EQUAL 0 OR (pos GREATER 0 AND name MATCHES "^lib${pattern}"))
        message(FATAL_ERROR "Layering violation: ${target} links ${lib} "
                            "(matches forbidden '${pattern}'; see docs/architecture.md)")
      endif()
    endforeach()
  endforeach()
endfunction()

# kvscope_forbid_includes(folder "prefix;prefix"): fails configuration when a
# source or header under `folder` (relative to the source root) includes a
# header under one of the prefixes ("capture/policy/"). The folders inside
# one library (capture/) share a link target, so their direction is checked
# on the includes. Re-checked whenever CMake re-runs (a changed
# sources.cmake, a new file): CMAKE_CONFIGURE_DEPENDS on the folder's glob.
function(kvscope_forbid_includes folder prefixes)
  file(GLOB_RECURSE files CONFIGURE_DEPENDS "${KVSCOPE_SOURCE_ROOT}/${folder}/*.h"
       "${KVSCOPE_SOURCE_ROOT}/${folder}/*.cpp" "${KVSCOPE_SOURCE_ROOT}/${folder}/*.cu")
  foreach(file ${files})
    file(STRINGS "${file}" includes REGEX "^#include \"")
    foreach(line ${includes})
      foreach(prefix ${prefixes})
        string(FIND "${line}" "#include \"${prefix}" pos)
        if(pos EQUAL 0)
          file(RELATIVE_PATH rel "${KVSCOPE_SOURCE_ROOT}" "${file}")
          message(FATAL_ERROR "Layering violation: ${rel} has `${line}`: ${folder}/ includes "
                              "nothing under ${prefix} (see docs/architecture.md)")
        endif()
      endforeach()
    endforeach()
  endforeach()
endfunction()
